/**
 * `npm run bench:cluster`: what a 3-master Redis Cluster costs against one Redis. The same server code
 * runs twice on one PostgreSQL database, once on one Redis and once on a cluster this bench starts on
 * its own ports (test/support/redis-cluster.ts); validate and heartbeat at 64 connections are measured
 * against both in alternating rounds, so each ratio is read within one run, the server not measured
 * paused meanwhile (SIGSTOP). Needs wrk.
 *
 * The licenses belong to one app of one account, so on the cluster every request goes to the one master
 * of that account's shard: this measures the cost per request, not what spreading accounts over the
 * masters gains.
 *
 * Settings (environment): BENCH_PG_ADMIN_URL (default postgres://postgres@127.0.0.1:5432/postgres; a
 * database ls_bench_cluster_<pid> is created there and dropped at the end), BENCH_REDIS_URL (the one
 * Redis, default redis://127.0.0.1:6379/5; flushed before and after), BENCH_DURATION seconds per
 * scenario and round (5), BENCH_LICENSES (1000), BENCH_ROUNDS (3), BENCH_PROCESSES (SERVER_PROCESSES, 1).
 */
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setLogLevel } from '../src/lib/log'
import { ownRedisCluster } from '../test/support/redis-cluster'
import { seedAuthData } from './seed'
import { launchServer, measureAlone, runWrk, type Server } from './server'
import { benchStores, median } from './stores'

const ADMIN_URL = process.env.BENCH_PG_ADMIN_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
const REDIS_URL = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379/5'
const DURATION = Number(process.env.BENCH_DURATION ?? 5)
const LICENSES = Number(process.env.BENCH_LICENSES ?? 1000)
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3)
const PROCESSES = process.env.BENCH_PROCESSES ?? '1'
const work = mkdtempSync(join(tmpdir(), 'ls-bench-cluster-'))
const root = join(import.meta.dir, '..')

interface Result {
  rps: number
  p50: number
  p99: number
  errors: number
}

let runs = 0
/** Both servers; each is paused while the other is measured. */
const servers: Server[] = []

const wrk = (server: Server, mode: string, connections: number, seconds: number): Promise<Result> =>
  measureAlone(servers, server, async () => {
    const runId = `${process.pid.toString(16)}c${(runs++).toString(16)}x`
    const { rps, p50, p99, errors } = await runWrk([
      '-t2', `-c${connections}`, `-d${seconds}s`,
      '-s', join(import.meta.dir, 'auth.lua'), server.url, '--', mode, join(work, 'data.txt'), runId,
    ])
    return { rps, p50, p99, errors }
  })


async function main() {
  setLogLevel('warn')
  const stores = await benchStores(ADMIN_URL, REDIS_URL, `ls_bench_cluster_${process.pid}`)
  const cluster = await ownRedisCluster()
  try {
    const env = {
      DATABASE_URL: stores.databaseUrl,
      REDIS_URL,
      MASTER_KEY: Buffer.alloc(32, 42).toString('hex'),
      DATA_DIR: work,
      SERVER_PROCESSES: PROCESSES,
      // Limits on, at values this load never reaches: the buckets run, nothing is refused.
      VALIDATE_LIMIT_PER_IP: '1000000000',
      VALIDATE_LIMIT_PER_LICENSE: '1000000000',
    }
    console.log(`seeding ${LICENSES} licenses with bound HWIDs…`)
    await seedAuthData(env, LICENSES, join(work, 'data.txt'))
    const single = await launchServer(root, env)
    servers.push(single)
    const clustered = await launchServer(root, { ...env, REDIS_URL: cluster.url, REDIS_CLUSTER: 'true' })
    servers.push(clustered)
    for (const server of servers) for (const mode of ['validate', 'heartbeat']) await wrk(server, mode, 16, 3)

    const samples: Record<string, Result[]> = {}
    const run = async (name: string, server: Server, mode: string) => {
      const r = await wrk(server, mode, 64, DURATION)
      ;(samples[`${mode} ${name}`] ??= []).push(r)
      console.log(`  ${mode.padEnd(9)} ${name.padEnd(13)} ${r.rps.toFixed(0).padStart(7)} req/s  p50 ${r.p50.toFixed(2)} ms  p99 ${r.p99.toFixed(2)} ms${r.errors ? `  non-2xx ${r.errors}` : ''}`)
    }
    for (let round = 1; round <= ROUNDS; round++) {
      console.log(`round ${round}/${ROUNDS}`)
      for (const mode of ['validate', 'heartbeat']) {
        const pair = [() => run('one Redis', single, mode), () => run('3-node cluster', clustered, mode)]
        for (const step of round % 2 === 1 ? pair : pair.reverse()) await step()
      }
    }
    console.log(`\nsummary, 64 connections, SERVER_PROCESSES=${PROCESSES}, ${ROUNDS} rounds (medians; ratio: median of each round's cluster ÷ one Redis)`)
    for (const mode of ['validate', 'heartbeat']) {
      const one = samples[`${mode} one Redis`] as Result[]
      const many = samples[`${mode} 3-node cluster`] as Result[]
      const show = (list: Result[]) =>
        `${median(list.map((r) => r.rps)).toFixed(0)} req/s, p50 ${median(list.map((r) => r.p50)).toFixed(2)} ms, p99 ${median(list.map((r) => r.p99)).toFixed(2)} ms`
      const ratio = median(many.map((r, i) => r.rps / (one[i] as Result).rps))
      console.log(`  ${mode.padEnd(9)} one Redis ${show(one)}; cluster ${show(many)}; cluster ÷ one Redis ${ratio.toFixed(2)}`)
    }
    const errors = Object.values(samples).flat().reduce((n, r) => n + r.errors, 0)
    console.log(`  non-2xx responses: ${errors}`)
  } finally {
    await Promise.all(servers.map((s) => s.stop()))
    await cluster.stop()
    await stores.close()
  }
}

await main()
