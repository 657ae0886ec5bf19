/**
 * `npm run bench`: load test of the client endpoints against the real server on PostgreSQL + Redis,
 * with a bare Elysia route measured in the same run as the baseline. Every server but the one measured is
 * paused meanwhile (SIGSTOP), so no idle server's timers or collector take the cores. Needs wrk (apt-get install wrk).
 *
 * Settings (environment): BENCH_PG_ADMIN_URL (default postgres://postgres@127.0.0.1:5432/postgres; a
 * database ls_bench_<pid> is created there and dropped at the end, and those of benches killed before
 * theirs on a local PostgreSQL are dropped first), BENCH_REDIS_URL (default
 * redis://127.0.0.1:6379/14; flushed before and after), BENCH_DURATION seconds per scenario and round (5),
 * BENCH_LICENSES (1000), BENCH_ROUNDS (4; the Redis database is first filled with keys standing for a week's nonces, sized to
 * leave room for the run's own: presizeKeyspace in stores.ts), BENCH_PROCESSES (the server's SERVER_PROCESSES; unset, the server
 * gets none and runs its default, the configuration a production install with DATABASE_URL and REDIS_URL gets), BENCH_PROFILE_DIR (when set, the server under test writes a CPU
 * profile there when it stops, in markdown and as samples for bench/profile.ts; its first process only), BENCH_COMPARE (the root of another
 * checkout of this project, e.g. a `git worktree` of the commit before a change: its servers, limits on and
 * off, run beside this checkout's on the same database and Redis, and each round measures every scenario
 * of both back to back, in turn first, so "this checkout ÷ BENCH_COMPARE" per scenario is read in one run
 * on one machine state).
 * `npm run bench:webhooks` (bench/validate-webhook.ts) is the variant with a subscribed license.validated webhook.
 */
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setLogLevel } from '../src/lib/log'
import { machineTicks, redisCounters } from './proc'
import { seedAuthData } from './seed'
import { DIE_WITH_BENCH, launchServer, measureAlone, profileFlags, runWrk, type Server, spawnServer } from './server'
import { benchStores, median, presizeKeyspace } from './stores'

const ADMIN_URL = process.env.BENCH_PG_ADMIN_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
const REDIS_URL = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379/14'
const DURATION = Number(process.env.BENCH_DURATION ?? 5)
const LICENSES = Number(process.env.BENCH_LICENSES ?? 1000)
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 4)
const PROCESSES = process.env.BENCH_PROCESSES || null
const COMPARE = process.env.BENCH_COMPARE
const MASTER_KEY = Buffer.alloc(32, 42).toString('hex')
const root = join(import.meta.dir, '..')
const work = mkdtempSync(join(tmpdir(), 'ls-bench-'))

interface Result {
  name: string
  connections: number
  rps: number
  p50: number
  p99: number
  errors: number
  /** Server CPU time per request (µs): robust to outside load, unlike req/s. */
  cpuUs: number
  /** The server main thread's share of cpuUs. */
  mainUs: number
  /** Share of the machine's CPU time left idle during the run: above a few % means it was not CPU-bound. */
  idlePct: number
  /** Redis CPU per request (µs; the whole Redis server, so other users of it add to it). */
  redisUs: number
  /** Redis's time inside scripts per request (µs; the authorize call's, mostly): commandstats count wall time, so a preempted Redis adds to it. */
  scriptUs: number
  /** wrk's own CPU per request (µs): its Lua builds every request body. */
  wrkUs: number
}


/** The server's warning and error lines past `from` (a length of its log), at most 5. */
const warningsSince = (server: Server, from: number) =>
  server.log().slice(from).split('\n').filter((line) => /"level":"(warn|error)"/.test(line)).slice(0, 5)

let runCounter = 0
/** Every server started; each is paused while another is measured. */
const servers: Server[] = []

const wrk = (name: string, server: Server, mode: string, connections: number, seconds: number) =>
  measureAlone(servers, server, () => measure(name, server, mode, connections, seconds))

async function measure(name: string, server: Server, mode: string, connections: number, seconds: number): Promise<Result> {
  const url = server.url
  const redis0 = redisCounters(REDIS_URL)
  const cpu0 = server.cpu()
  const main0 = server.mainCpu()
  const ticks0 = machineTicks()
  const runId = `${process.pid.toString(16)}r${(runCounter++).toString(16)}x`
  const threads = Math.min(2, connections)
  const { rps, p50, p99, errors, total, cpuUs: wrkCpuUs } = await runWrk([
    `-t${threads}`, `-c${connections}`, `-d${seconds}s`,
    '-s', join(import.meta.dir, 'auth.lua'), url, '--', mode, join(work, 'data.txt'), runId,
  ])
  const cpuUs = ((server.cpu() - cpu0) * 1e6) / total
  const mainUs = ((server.mainCpu() - main0) * 1e6) / total
  const ticks = machineTicks()
  const idlePct = (100 * (ticks.idle - ticks0.idle)) / (ticks.total - ticks0.total)
  const redis = redisCounters(REDIS_URL)
  const redisUs = ((redis.cpuSeconds - redis0.cpuSeconds) * 1e6) / total
  const scriptUs = (redis.scriptUs - redis0.scriptUs) / total
  const wrkUs = wrkCpuUs / total
  return { name, connections, rps, p50, p99, errors, cpuUs, mainUs, idlePct, redisUs, scriptUs, wrkUs }
}

async function main() {
  setLogLevel('warn')
  const stores = await benchStores(ADMIN_URL, REDIS_URL, `ls_bench_${process.pid}`)
  try {
    const env = {
      DATABASE_URL: stores.databaseUrl,
      REDIS_URL,
      MASTER_KEY,
      DATA_DIR: work,
      ...(PROCESSES ? { SERVER_PROCESSES: PROCESSES } : {}),
      // Limits on, at values this load never reaches: the buckets run, nothing is refused.
      VALIDATE_LIMIT_PER_IP: '1000000000',
      VALIDATE_LIMIT_PER_LICENSE: '1000000000',
    }
    console.log(`seeding ${LICENSES} licenses with bound HWIDs…`)
    await seedAuthData(env, LICENSES, join(work, 'data.txt'))
    // The nonces of every validate run, at up to 30,000 a second with 64 or 16 connections and 5,000 with one.
    const servers64 = COMPARE ? 4 : 2
    const seconds64 = ROUNDS * DURATION * servers64 + 3 * servers64
    const seconds1 = (COMPARE ? ROUNDS * DURATION * 2 : 0) + DURATION
    console.log('readying the Redis keyspace for the run\'s nonces…')
    await presizeKeyspace(stores.redis, seconds64 * 30_000 + seconds1 * 5_000)

    const baseline = await spawnServer(join(import.meta.dir, 'baseline.ts'), {}, [DIE_WITH_BENCH])
    servers.push(baseline)
    const limited = await launchServer(root, env, profileFlags())
    servers.push(limited)
    const unlimited = await launchServer(root, { ...env, PUBLIC_RATE_LIMITS: 'false' })
    servers.push(unlimited)
    const before = COMPARE
      ? {
          limited: await launchServer(COMPARE, env),
          unlimited: await launchServer(COMPARE, { ...env, PUBLIC_RATE_LIMITS: 'false' }),
        }
      : null
    if (before) servers.push(before.limited, before.unlimited)

    // Warm-up: JIT, connection pools, and every license into the server caches.
    const warmUps = [[baseline, 'baseline'], [limited, 'validate'], [limited, 'heartbeat'], [unlimited, 'validate']] as [Server, string][]
    if (before) warmUps.push([before.limited, 'validate'], [before.limited, 'heartbeat'], [before.unlimited, 'validate'])
    for (const [server, mode] of warmUps) await wrk('warm-up', server, mode, 16, 3)
    const results: Result[] = []
    const run = async (name: string, server: Server, mode: string, c: number) => {
      const logged = server.log().length
      const r = await wrk(name, server, mode, c, DURATION)
      results.push(r)
      console.log(`  ${name.padEnd(36)} c=${String(c).padStart(2)}  ${r.rps.toFixed(0).padStart(7)} req/s  p50 ${r.p50.toFixed(2)} ms  p99 ${r.p99.toFixed(2)} ms  server CPU ${r.cpuUs.toFixed(0)} µs/req (main thread ${r.mainUs.toFixed(0)}), Redis ${r.redisUs.toFixed(0)} (scripts ${r.scriptUs.toFixed(0)}), wrk ${r.wrkUs.toFixed(0)}; machine idle ${r.idlePct.toFixed(0)}%${r.errors ? `  non-2xx ${r.errors}` : ''}`)
      // What the server said of them: a failure's warning or error line (its request id, no body).
      if (r.errors) for (const line of warningsSince(server, logged)) console.log(`    server: ${line.slice(0, 300)}`)
      return r
    }
    // The machine is shared and noisy: interleave the scenarios over several rounds and keep each
    // one's best round, so a burst of outside load hits one sample instead of one scenario.
    const best = (list: Result[]) => list.reduce((a, b) => (b.rps > a.rps ? b : a))
    const samples: Record<string, Result[]> = { base: [], val: [], hb: [], off: [] }
    // Every scenario against BENCH_COMPARE's same scenario: "no scenario slower by more than 3 %".
    const comparisons = before
      ? [
          { name: 'validate', mode: 'validate', c: 64, now: limited, then: before.limited },
          { name: 'heartbeat', mode: 'heartbeat', c: 64, now: limited, then: before.limited },
          { name: 'validate, limits off', mode: 'validate', c: 64, now: unlimited, then: before.unlimited },
          { name: 'validate', mode: 'validate', c: 1, now: limited, then: before.limited },
          { name: 'heartbeat', mode: 'heartbeat', c: 1, now: limited, then: before.limited },
        ].map((scenario) => ({ ...scenario, ratios: [] as number[] }))
      : []
    for (let round = 1; round <= ROUNDS; round++) {
      console.log(`round ${round}/${ROUNDS}`)
      samples.base!.push(await run('baseline (bare Elysia)', baseline, 'baseline', 64))
      // Limits on and off run back to back, in turn first, so their ratio per round sees one machine state.
      const pair = () => [
        async () => samples.val!.push(await run('validate', limited, 'validate', 64)),
        async () => samples.off!.push(await run('validate, limits off', unlimited, 'validate', 64)),
      ]
      for (const step of round % 2 === 1 ? pair() : pair().reverse()) await step()
      samples.hb!.push(await run('heartbeat', limited, 'heartbeat', 64))
      for (const { name, mode, c, now, then, ratios } of comparisons) {
        const mine = () => run(`${name} (this checkout)`, now, mode, c)
        const theirs = () => run(`${name} (BENCH_COMPARE)`, then, mode, c)
        if (round % 2 === 1) {
          const r = await mine()
          ratios.push(r.rps / (await theirs()).rps)
        } else {
          const r = await theirs()
          ratios.push((await mine()).rps / r.rps)
        }
      }
    }
    console.log('single connection')
    const base1 = await run('baseline (bare Elysia)', baseline, 'baseline', 1)
    const val1 = await run('validate', limited, 'validate', 1)
    const hb1 = await run('heartbeat', limited, 'heartbeat', 1)
    const [base64, val64, hb64, off64] = [best(samples.base!), best(samples.val!), best(samples.hb!), best(samples.off!)]

    const check = (ok: boolean) => (ok ? 'ok  ' : 'MISS')
    // Each round's ratio to the baseline of the same round: a burst of outside load (this machine's
    // baseline varies by half between runs) then moves both sides of one ratio, not one side of all.
    const perRoundRatios = (list: Result[]) => list.map((r, i) => r.rps / (samples.base![i] as Result).rps)
    const ratios = (list: Result[]) => perRoundRatios(list).map((r) => r.toFixed(2)).join(', ')
    const config = PROCESSES ? `SERVER_PROCESSES=${PROCESSES}` : 'SERVER_PROCESSES unset (the default configuration)'
    console.log(`\nsummary of ${ROUNDS} rounds, DATABASE_URL and REDIS_URL set, ${config}: ${limited.processes} server process(es)`)
    console.log('  req/s and latency at 64 connections: each scenario\'s best round; ratio: median of the rounds\' ratios to that round\'s baseline')
    const minCpu = (list: Result[]) => Math.min(...list.map((r) => r.cpuUs))
    console.log(`  baseline (bare Elysia): ${base64.rps.toFixed(0)} req/s, p50 ${base64.p50.toFixed(2)} ms, p99 ${base64.p99.toFixed(2)} ms at c=64, p50 ${base1.p50.toFixed(3)} ms at c=1; server CPU ${minCpu(samples.base!).toFixed(0)} µs/req`)
    // The targets of the default configuration: ratio >= 0.30, p99 <= 15 ms at 64 connections, p50 <= 1 ms at one.
    for (const [name, list, best64, one] of [['validate', samples.val!, val64, val1], ['heartbeat', samples.hb!, hb64, hb1]] as const) {
      const ratio = median(perRoundRatios(list))
      console.log(`  ${name}: ${best64.rps.toFixed(0)} req/s; server CPU ${minCpu(list).toFixed(0)} µs/req (least of the rounds)`)
      console.log(`    ${check(ratio >= 0.3)} ${ratio.toFixed(2)} of baseline (rounds: ${ratios(list)}; best of each: ${(best64.rps / base64.rps).toFixed(2)}) (>= 0.30)`)
      console.log(`    ${check(best64.p99 <= 15)} c=64: p99 ${best64.p99.toFixed(2)} ms (<= 15), p50 ${best64.p50.toFixed(2)} ms`)
      console.log(`    ${check(one.p50 <= 1)} c=1: p50 ${one.p50.toFixed(3)} ms (<= 1)`)
    }
    console.log(`  validate with limits off: ${off64.rps.toFixed(0)} req/s; server CPU ${minCpu(samples.off!).toFixed(0)} µs/req`)
    const perRound = samples.val!.map((r, i) => r.rps / (samples.off![i] as Result).rps)
    const limitsRatio = median(perRound)
    console.log(`  ${check(limitsRatio >= 0.9)} validate with limits = ${limitsRatio.toFixed(2)} of limits off, median of the rounds' back-to-back pairs (${perRound.map((r) => r.toFixed(2)).join(', ')}; best of each: ${(val64.rps / off64.rps).toFixed(2)}) (>= 0.90)`)
    for (const { name, c, ratios } of comparisons) {
      const ratio = median(ratios)
      console.log(`  ${check(ratio >= 0.97)} ${name} c=${c}: this checkout ÷ BENCH_COMPARE = ${ratio.toFixed(3)} req/s, median of the rounds' back-to-back pairs (${ratios.map((r) => r.toFixed(3)).join(', ')}) (>= 0.97)`)
    }
    const machineUs = (r: Result) => r.cpuUs + r.redisUs + r.wrkUs
    const scriptMedian = (list: Result[]) => median(list.map((r) => r.scriptUs)).toFixed(0)
    console.log(`  CPU per validate (server + Redis + wrk, median): limits on ${median(samples.val!.map(machineUs)).toFixed(0)} µs, off ${median(samples.off!.map(machineUs)).toFixed(0)} µs; of Redis's, its scripts ${scriptMedian(samples.val!)} µs on, ${scriptMedian(samples.off!)} off`)
    const errors = results.reduce((n, r) => n + (r.name.startsWith('baseline') ? 0 : r.errors), 0)
    console.log(`  ${check(errors === 0)} non-2xx responses on the auth routes: ${errors}`)
  } finally {
    await Promise.all(servers.map((s) => s.stop()))
    await stores.close()
  }
}

await main()
