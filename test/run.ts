/**
 * `npm test`: runs the suite twice, against real PostgreSQL + Redis (a fresh database created and
 * dropped here, a Redis DB index of its own) and against the embedded PGlite + in-process store (a file
 * whose subject is one pass's in that pass only: ONLY_IN), then prints one closing line
 * "N passed, M failed" over both passes, after the suite's `SKIPPED:` warnings.
 *
 * The two passes run at the same time: they share no state (each its own database, the embedded one
 * no Redis), and the first waits on PostgreSQL and Redis where the second keeps the CPU busy, so
 * together they take little more than the embedded pass alone. Each pass's report is printed whole
 * when it ends, so the two never interleave.
 */
import { existsSync } from 'node:fs'
import postgres from 'postgres'

const PG_ADMIN_URL = process.env.TEST_PG_ADMIN_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
const REDIS_BASE = process.env.TEST_REDIS_BASE ?? 'redis://127.0.0.1:6379'
const REDIS_DB = process.env.TEST_REDIS_DB ?? '11'
const extraArgs = process.argv.slice(2)

interface Pass {
  name: string
  passed: number
  failed: number
  exitCode: number
  /** The suite's own `SKIPPED: …` warnings: tests it left out because this machine lacks a tool. */
  skipped: string[]
}

/**
 * Files whose subject is one pass's, run in that pass only: in the other they would check the same code
 * against the same servers again, a minute of the suite's time. Tests of Redis's faults bring a
 * redis-server of their own, and the embedded database's upkeep, the stall watchdog, the docs page and
 * deadlines depend on no storage setting. The image test builds the image once and runs it on both
 * backends in the first pass.
 */
const ONLY_IN = {
  postgres: [
    'test/client-auth/store-outage.test.ts',
    'test/deploy/image.test.ts',
    'test/faults/late-credit-calls.test.ts',
    'test/faults/lost-replies.test.ts',
    'test/faults/shard-count.test.ts',
    'test/faults/store-credits.test.ts',
    'test/faults/store-forgotten-connection.test.ts',
    'test/faults/store-loss.test.ts',
    'test/faults/store-replies.test.ts',
    'test/faults/store-rollback.test.ts',
    'test/store/redis-eviction.test.ts',
  ],
  embedded: [
    'test/db/embedded-upkeep.test.ts',
    'test/http/docs-ui.test.ts',
    'test/lib/stall-watchdog.test.ts',
    'test/lib/with-timeout.test.ts',
  ],
}
// A file moved or renamed would quietly run in both passes again.
for (const path of [...ONLY_IN.postgres, ...ONLY_IN.embedded]) {
  if (!existsSync(path)) throw new Error(`test/run.ts ONLY_IN names ${path}, which is not there`)
}

async function runPass(name: string, env: Record<string, string>, othersOnly: string[]): Promise<Pass> {
  // Files or tests named on the command line run in both passes: one the other pass owns would leave this
  // pass with nothing to run, which bun test fails.
  const ignored = extraArgs.length ? [] : othersOnly.map((path) => `--path-ignore-patterns=${path}`)
  const proc = Bun.spawn([process.execPath, 'test', '--timeout', '30000', ...ignored, ...extraArgs], {
    env: { ...process.env, ...env },
    stdout: 'pipe',
    stderr: 'pipe',
  })
  // bun test writes its report to stderr: kept to print and to count.
  const [output, report, exitCode] = await Promise.all([
    new Response(proc.stdout).text(),
    new Response(proc.stderr).text(),
    proc.exited,
  ])
  console.log(`\n=== ${name} ===`)
  process.stdout.write(output)
  process.stderr.write(report)
  const count = (word: string) => Number(new RegExp(`^\\s*(\\d+) ${word}$`, 'm').exec(report)?.[1] ?? 0)
  const skipped = report.match(/^SKIPPED: .*$/gm) ?? []
  return { name, passed: count('pass'), failed: count('fail'), exitCode, skipped }
}

async function withFreshDatabase<T>(fn: (url: string) => Promise<T>): Promise<T> {
  const name = `ls_test_${process.pid}_${Date.now()}`
  const admin = postgres(PG_ADMIN_URL, { max: 1, onnotice: () => {} })
  await admin.unsafe(`CREATE DATABASE ${name}`)
  try {
    const url = new URL(PG_ADMIN_URL)
    url.pathname = `/${name}`
    return await fn(url.toString())
  } finally {
    await admin.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
    await admin.end()
  }
}

async function flushRedis(url: string): Promise<void> {
  const { default: Redis } = await import('ioredis')
  const redis = new Redis(url, { maxRetriesPerRequest: 1 })
  await redis.flushdb()
  redis.disconnect()
}

/** A pass whose set-up failed (PostgreSQL or Redis unreachable) counts as crashed; the other still reports. */
const crashed =
  (name: string) =>
  (err: unknown): Pass => {
    console.log(`\n=== ${name} ===\ncould not run: ${err}`)
    return { name, passed: 0, failed: 0, exitCode: 1, skipped: [] }
  }

const realServers = withFreshDatabase(async (databaseUrl) => {
  const redisUrl = `${REDIS_BASE}/${REDIS_DB}`
  await flushRedis(redisUrl)
  try {
    return await runPass('PostgreSQL + Redis', {
      TEST_DATABASE_URL: databaseUrl,
      TEST_REDIS_URL: redisUrl,
      TEST_REDIS_BASE: REDIS_BASE,
    }, ONLY_IN.embedded)
  } finally {
    await flushRedis(redisUrl)
  }
}).catch(crashed('PostgreSQL + Redis'))
const embedded = runPass('embedded (PGlite + in-process store)', { TEST_DATABASE_URL: '', TEST_REDIS_URL: '' }, ONLY_IN.postgres)
const passes: Pass[] = await Promise.all([realServers, embedded])

let passed = 0
let failed = 0
console.log('')
// Repeated here, where a reader of the counts looks: a machine without Go or Chromium passes with fewer tests.
for (const line of new Set(passes.flatMap((p) => p.skipped))) console.log(line)
for (const p of passes) {
  // A pass that crashed before reporting counts as a failure even if no test did.
  const crashed = p.exitCode !== 0 && p.failed === 0 ? 1 : 0
  console.log(`${p.name}: ${p.passed} passed, ${p.failed + crashed} failed`)
  passed += p.passed
  failed += p.failed + crashed
}
console.log(`${passed} passed, ${failed} failed`)
process.exit(failed > 0 ? 1 : 0)
