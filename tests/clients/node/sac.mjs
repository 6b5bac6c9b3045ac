// A single active consumer of the official Node.js client, run until killed:
//
//   TIERLOG_NODE_MODULES=<dir>/node_modules node sac.mjs <host> <port> <stream> <group>
//
// Subscribes to <stream> in group <group> (singleActive, consumerRef), stores the offset
// of every message it handles and then prints it on a line of its own; when it becomes
// active it answers ConsumerUpdate with the group's stored offset + 1 (first when none is
// stored), as the client's documentation shows. Prints "subscribed" once subscribed.
// tests/clients/test_sac_node.py kills the active one and watches the other take over.
import { createRequire } from "node:module"

const require = createRequire(`${process.env.TIERLOG_NODE_MODULES}/`)
const rabbit = require("rabbitmq-stream-js-client")
const { Offset } = rabbit

const [host, portText, stream, group] = process.argv.slice(2)

const client = await rabbit.connect({
  hostname: host,
  port: Number(portText),
  username: "guest",
  password: "guest",
  vhost: "/",
})

async function startAt(reference, name) {
  try {
    const stored = await client.queryOffset({ reference, stream: name })
    return Offset.offset(BigInt(stored) + 1n)
  } catch (error) {
    return Offset.first() // nothing stored yet (NO_OFFSET)
  }
}

let consumer = null
consumer = await client.declareConsumer(
  {
    stream,
    offset: Offset.first(),
    singleActive: true,
    consumerRef: group,
    consumerUpdateListener: startAt,
  },
  async (message) => {
    await consumer.storeOffset(message.offset)
    process.stdout.write(`${message.offset}\n`)
  },
)
process.stdout.write("subscribed\n")
setInterval(() => {}, 1 << 30) // until killed
