// pg-boss chains on the machine's PostgreSQL, the peer of `pg_bench` part 1
// (docs/benchmarks.md): a chain is 3 jobs, each sent by the handler of the
// one before (as apollo's 3 steps), all heads sent at once up front. Prints
// one JSON line per mode: {"mode", "chains", "secs", "chains_per_s"}.
//
//   node chains.mjs [CHAINS] [MODES]     e.g. node chains.mjs 3000 64x1,16x4,1x64
//
// A mode is BATCHxWORKERS: each worker fetches up to BATCH jobs, runs their
// handlers, sends the follow-ups of the batch in one insert, and is woken at
// once (notifyWorker) instead of waiting out its polling interval.
import PgBoss from 'pg-boss'

const url = process.env.APOLLO_TEST_DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/test'
const chains = Number(process.argv[2] || 3000)
const modes = (process.argv[3] || '64x1,16x4,1x64').split(',').map(m => m.split('x').map(Number))

async function run ([batch, workers]) {
  const schema = `pgboss_bench_${process.pid}`
  const boss = new PgBoss({ connectionString: url, schema, max: 16, supervise: false, schedule: false, migrate: true })
  boss.on('error', e => console.error('pg-boss:', e.message))
  await boss.start()
  const queue = 'chain'
  await boss.createQueue(queue)
  let done = 0
  let finish
  const finished = new Promise(resolve => { finish = resolve })
  const ids = []
  const handler = async jobs => {
    const next = []
    for (const j of jobs) {
      if (j.data.step < 3) next.push({ name: queue, data: { chain: j.data.chain, step: j.data.step + 1 } })
      else done++
    }
    if (next.length) {
      await boss.insert(next)
      ids.forEach(id => boss.notifyWorker(id))
    }
    if (done >= chains) finish()
  }
  const heads = Array.from({ length: chains }, (_, k) => ({ name: queue, data: { chain: k, step: 1 } }))
  const started = process.hrtime.bigint()
  await boss.insert(heads)
  for (let w = 0; w < workers; w++) {
    ids.push(await boss.work(queue, { batchSize: batch, pollingIntervalSeconds: 0.5 }, handler))
  }
  await finished
  const secs = Number(process.hrtime.bigint() - started) / 1e9
  await boss.stop({ graceful: false, wait: true })
  const db = new (await import('pg')).default.Client({ connectionString: url })
  await db.connect()
  await db.query(`DROP SCHEMA ${schema} CASCADE`)
  await db.end()
  return { mode: `${batch}x${workers}`, chains, secs: +secs.toFixed(3), chains_per_s: Math.round(chains / secs) }
}

for (const m of modes) console.log(JSON.stringify(await run(m)))
