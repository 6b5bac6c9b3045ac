// End-to-end run of the official Node.js RabbitMQ stream client against tierlog.
//
//   TIERLOG_NODE_MODULES=<dir>/node_modules node e2e.mjs <host> <port> <stream>
//
// Connects, creates <stream>, publishes with confirms from a named producer (dedup on),
// resends the same publishing ids (they must be dropped), then consumes with every
// offset specification. Prints one JSON object on stdout; tests/clients/test_node_client.py
// checks it. Everything has a deadline: a missing delivery ends the run, never hangs it.
import { createRequire } from "node:module"

const require = createRequire(`${process.env.TIERLOG_NODE_MODULES}/`)
const rabbit = require("rabbitmq-stream-js-client")
const { Offset } = rabbit

const [host, portText, stream] = process.argv.slice(2)
const FIRST_BATCH = 100
const SECOND_BATCH = 10
const TOTAL = FIRST_BATCH + SECOND_BATCH
const DEADLINE_MS = 10000

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

const step = (what) => console.error(`${new Date().toISOString()} ${what}`)

async function until(condition, what) {
  const deadline = Date.now() + DEADLINE_MS
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(10)
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
await client.createStream({ stream })

// ---- publish with confirms, named producer (deduplication on)
const publisher = await client.declarePublisher({ stream, publisherRef: "node-e2e-producer" })
const confirmed = new Set()
const errored = []
publisher.on("publish_confirm", (err, ids) => {
  if (err === null) ids.forEach((id) => confirmed.add(id))
  else errored.push(...ids.map((id) => [Number(id), err]))
})

async function publish(from, to, prefix) {
  step(`publish ${prefix} ${from}..${to}`)
  for (let id = from; id <= to; id++) {
    await publisher.send(Buffer.from(`${prefix}-${id}`), { publishingId: BigInt(id) })
  }
  await publisher.flush()
  await until(() => [...range(from, to)].every((id) => confirmed.has(BigInt(id))), `confirms ${from}..${to}`)
}

function* range(from, to) {
  for (let id = from; id <= to; id++) yield id
}

await publish(1, FIRST_BATCH, "m")
out.confirmed_first_batch = confirmed.size
// a timestamp between the two batches (chunk timestamps are the server's clock, in ms)
await sleep(50)
const between = new Date()
await sleep(50)
await publish(FIRST_BATCH + 1, TOTAL, "m")
out.last_publishing_id = Number(await publisher.getLastPublishingId())

// ---- resend the same publishing ids: deduplicated (confirmed again, never stored twice)
confirmed.clear()
await publish(1, TOTAL, "dup")
out.duplicates_confirmed = confirmed.size
out.publish_errors = errored

// ---- consume with every offset specification
async function consume(offset, wanted, label) {
  step(`consume ${label}`)
  const got = []
  const consumer = await client.declareConsumer({ stream, offset }, (message) => {
    got.push([Number(message.offset), message.content.toString()])
  })
  try {
    await until(() => got.length >= wanted, `${label}: ${wanted} messages (got ${got.length})`)
    await sleep(200) // anything extra would arrive now
  } finally {
    await client.closeConsumer(consumer.extendedId)
  }
  return got
}

out.consumed = {}
out.consumed.first = await consume(Offset.first(), TOTAL, "first")
out.consumed.offset_50 = await consume(Offset.offset(50n), TOTAL - 50, "offset 50")
out.consumed.timestamp = await consume(Offset.timestamp(between), SECOND_BATCH, "timestamp")
out.consumed.last = await consume(Offset.last(), 1, "last")

// next: nothing until a new message is published
const nextGot = []
const nextConsumer = await client.declareConsumer({ stream, offset: Offset.next() }, (message) => {
  nextGot.push([Number(message.offset), message.content.toString()])
})
await sleep(300)
out.next_before_publish = nextGot.length
await publish(TOTAL + 1, TOTAL + 1, "after-next")
await until(() => nextGot.length >= 1, "next: the new message")
await sleep(200)
await client.closeConsumer(nextConsumer.extendedId)
out.consumed.next = nextGot

// ---- what tierlog does not serve yet is refused, by the client or by the server
async function refusal(attempt) {
  step(`refusal: ${attempt}`)
  try {
    await attempt()
    return null
  } catch (e) {
    return String(e?.message ?? e)
  }
}
out.refused = {
  create_super_stream: await refusal(() => client.createSuperStream({ streamName: `${stream}-super` })),
  filtering_publisher: await refusal(async () => {
    const filtering = await client.declarePublisher({ stream }, (msg) => "a")
    await filtering.send(Buffer.from("filtered"))
  }),
  filtering_consumer: await refusal(() =>
    client.declareConsumer(
      { stream, offset: Offset.first(), filter: { values: ["a"], postFilterFunc: () => true, matchUnfiltered: false } },
      () => {}
    )
  ),
  partitions: await refusal(() => client.queryPartitions({ superStream: `${stream}-super` })),
  route: await refusal(() => client.routeQuery({ routingKey: "k", superStream: `${stream}-super` })),
  stats_of_missing_stream: await refusal(() => client.streamStatsRequest(`${stream}-missing`)),
}
const stats = await client.streamStatsRequest(stream)
out.stats = { first_chunk_id: Number(stats.firstChunkId), committed_chunk_id: Number(stats.committedChunkId) }

await publisher.close()
await client.deleteStream({ stream })
await client.close()
console.log(JSON.stringify(out))
// the client keeps the connections of the refused declarations open: do not wait for them
process.exit(0)
