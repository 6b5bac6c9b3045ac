// Super streams with the official Node.js RabbitMQ stream client against tierlog.
//
//   TIERLOG_NODE_MODULES=<dir>/node_modules node super_stream.mjs <host> <port> <name>
//
// Creates super stream <name> (partitions <name>-eu, -us, -apac bound with those keys),
// answers of a second creation, Partitions and Route; publishes through the client's
// SuperStreamPublisher routing by key (Route) and by hash (the client's own murmur32),
// consumes every partition from the first offset, deletes the super stream. Prints one JSON
// object on stdout; tests/clients/test_node_client.py checks it.
//
// The client sends CreateSuperStream / DeleteSuperStream through `createSuperStream` only
// when the server announces RabbitMQ 3.13 or later; while tierlog announces an older
// release (docs/compatibility.md), the script sends the client's own request frames over
// its locator connection: the same encoder, the same answer handling.
import { createRequire } from "node:module"

const require = createRequire(`${process.env.TIERLOG_NODE_MODULES}/`)
const rabbit = require("rabbitmq-stream-js-client")
const semver = require("semver")
const { CreateSuperStreamRequest } = require("rabbitmq-stream-js-client/dist/requests/create_super_stream_request")
const { DeleteSuperStreamRequest } = require("rabbitmq-stream-js-client/dist/requests/delete_super_stream_request")
const { Offset } = rabbit

const [host, portText, name] = process.argv.slice(2)
const KEYS = ["eu", "us", "apac"]
const PER_KEY = 30
const DEADLINE_MS = 15000

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const step = (what) => console.error(`${new Date().toISOString()} ${what}`)

async function until(condition, what) {
  const deadline = Date.now() + DEADLINE_MS
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(10)
  }
}

async function attempt(call) {
  try {
    return { ok: true, value: await call() }
  } catch (e) {
    return { ok: false, error: String(e?.message ?? e) }
  }
}

const out = {}
const client = await rabbit.connect({
  hostname: host,
  port: Number(portText),
  username: "guest",
  password: "guest",
  vhost: "/",
})
out.server_version = client.rabbitManagementVersion
const announcesCreate = !semver.lt(semver.coerce(client.rabbitManagementVersion), "3.13.0")
out.created_with = announcesCreate ? "createSuperStream" : "CreateSuperStreamRequest"

const partitions = KEYS.map((k) => `${name}-${k}`)
async function create() {
  const request = new CreateSuperStreamRequest({ streamName: name, partitions, bindingKeys: KEYS, arguments: { "max-age": "1h" } })
  const res = await client.locatorConnection.sendAndWait(request)
  return res.code
}
step("create")
if (announcesCreate) {
  out.created = await client.createSuperStream({ streamName: name, arguments: { "max-age": "1h" } }, KEYS)
} else {
  out.created = (await create()) === 1
}
out.second_create_code = await create()
out.partitions = await client.queryPartitions({ superStream: name })
out.route_us = await client.routeQuery({ routingKey: "us", superStream: name })
out.route_none = await client.routeQuery({ routingKey: "nowhere", superStream: name })
out.partitions_of_missing = (await attempt(() => client.queryPartitions({ superStream: `${name}-missing` }))).error

// ---- publish through the client's super-stream publisher, by key and by hash
const keyOf = (content) => content.split(":")[0]
step("publish by key")
const byKey = await client.declareSuperStreamPublisher({ superStream: name, routingStrategy: "key" }, keyOf)
for (const key of KEYS) {
  for (let i = 0; i < PER_KEY; i++) await byKey.send(Buffer.from(`${key}:${i}`), {})
}
step("publish by hash")
const byHash = await client.declareSuperStreamPublisher({ superStream: name, routingStrategy: "hash" }, keyOf)
for (let i = 0; i < PER_KEY; i++) await byHash.send(Buffer.from(`customer-${i % 7}:${i}`), {})
await sleep(500) // the publishers batch: let the last batch go out before closing
await byKey.close()
await byHash.close()

// ---- consume every partition from its first offset
step("consume")
const seen = {}
let count = 0
const consumers = []
for (const partition of out.partitions) {
  consumers.push(
    await client.declareConsumer({ stream: partition, offset: Offset.first() }, (message) => {
      const body = message.content.toString()
      ;(seen[body] ??= []).push(partition)
      count++
    })
  )
}
await until(() => count >= KEYS.length * PER_KEY + PER_KEY, `every message (got ${count})`)
await sleep(300) // nothing more arrives
for (const consumer of consumers) await client.closeConsumer(consumer.extendedId)
out.seen = seen

step("delete")
if (announcesCreate) {
  out.deleted = await client.deleteSuperStream({ streamName: name })
} else {
  out.deleted = (await client.locatorConnection.sendAndWait(new DeleteSuperStreamRequest(name))).code === 1
}
out.partitions_after_delete = (await attempt(() => client.queryPartitions({ superStream: name }))).error
await client.close()
console.log(JSON.stringify(out))
process.exit(0)
