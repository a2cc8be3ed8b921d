'use strict'
// client.js is the JavaScript member of the kproxy interop harness, built on
// kafkajs. It prints the harness's JSON-lines protocol on stdout: assignment
// events carrying the member's full owned partition set, consumed records,
// commits, errors and "closed". --mode produce writes --count records with
// ids id-<start>..; --mode consume joins --group, commits after every batch
// and leaves the group cleanly on SIGTERM.
const { Kafka, logLevel, PartitionAssigners } = require('kafkajs')

function parseArgs(argv) {
  const a = {
    mode: 'consume', bootstrap: '127.0.0.1:9092', member: 'js', count: 0, start: 0,
    assignor: 'roundrobin', 'session-ms': 10000, 'heartbeat-ms': 1000,
  }
  for (let i = 0; i + 1 < argv.length; i += 2) {
    if (!argv[i].startsWith('--')) throw new Error(`bad argument ${argv[i]}`)
    a[argv[i].slice(2)] = argv[i + 1]
  }
  if (!a.topic) throw new Error('missing --topic')
  return a
}

const args = parseArgs(process.argv.slice(2))

function emit(ev, fields = {}) {
  process.stdout.write(JSON.stringify({ ...fields, ts: Date.now(), ev, member: args.member }) + '\n')
}

const kafka = new Kafka({
  clientId: args.member,
  brokers: [args.bootstrap],
  logLevel: logLevel.WARN,
  retry: { retries: 8, initialRetryTime: 100 },
})

async function produce() {
  const p = kafka.producer()
  await p.connect()
  const messages = []
  for (let i = Number(args.start); i < Number(args.start) + Number(args.count); i++) {
    messages.push({ key: `id-${i}`, value: `id-${i}` })
  }
  for (let i = 0; i < messages.length; i += 500) {
    await p.send({ topic: args.topic, acks: -1, messages: messages.slice(i, i + 500) })
  }
  await p.disconnect()
  emit('produced', { count: Number(args.count) })
}

async function consume() {
  // kafkajs ships only the round-robin assigner; it is eager.
  if (args.assignor !== 'roundrobin') throw new Error(`kafkajs supports only --assignor roundrobin, not ${args.assignor}`)
  const consumer = kafka.consumer({
    groupId: args.group,
    sessionTimeout: Number(args['session-ms']),
    heartbeatInterval: Number(args['heartbeat-ms']),
    rebalanceTimeout: 20000,
    maxWaitTimeInMs: 500,
    partitionAssigners: [PartitionAssigners.roundRobin],
    retry: { retries: 8, initialRetryTime: 100 },
  })
  const { GROUP_JOIN, REBALANCING, CRASH } = consumer.events
  consumer.on(GROUP_JOIN, (e) => {
    const parts = (e.payload.memberAssignment[args.topic] || []).slice().sort((x, y) => x - y)
    // kafkajs does not expose the generation id.
    emit('assigned', { generation: -1, partitions: parts })
  })
  consumer.on(REBALANCING, () => emit('revoked', { generation: -1, partitions: [] }))
  consumer.on(CRASH, (e) => emit('error', { error: `crash: ${e.payload.error && e.payload.error.message}` }))

  let stopping = false
  const stop = async () => {
    if (stopping) return
    stopping = true
    try {
      await consumer.disconnect()
    } catch (e) {
      emit('error', { error: `disconnect: ${e.message}` })
    }
    emit('closed')
    process.exit(0)
  }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)

  await consumer.connect()
  await consumer.subscribe({ topics: [args.topic], fromBeginning: true })
  emit('ready')
  await consumer.run({
    autoCommit: false,
    eachBatchAutoResolve: true,
    eachBatch: async ({ batch }) => {
      if (batch.messages.length === 0) return
      const last = batch.messages[batch.messages.length - 1]
      const next = (BigInt(last.offset) + 1n).toString()
      try {
        await consumer.commitOffsets([{ topic: batch.topic, partition: batch.partition, offset: next }])
      } catch (e) {
        emit('error', { error: `commit: ${e.message}` })
        throw e
      }
      for (const m of batch.messages) {
        emit('record', { p: batch.partition, o: Number(m.offset), id: m.value.toString() })
      }
      emit('commit', { offsets: { [String(batch.partition)]: Number(next) } })
    },
  })
}

const main = args.mode === 'produce' ? produce : consume
main().catch((e) => {
  emit('error', { error: `${e.name}: ${e.message}` })
  process.exit(1)
})
