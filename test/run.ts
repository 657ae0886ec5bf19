/**
 * `npm test`: runs the whole suite twice, against real PostgreSQL + Redis and against the embedded
 * PGlite + in-process store, then prints one closing line "N passed, M failed" over both passes, after
 * the suite's `SKIPPED:` warnings.
 *
 * Each pass splits the test files between `TEST_SHARDS` (default 2) `bun test` processes, and every
 * process of both passes runs at the same time: most tests wait (on servers they start, on deadlines,
 * on PostgreSQL and Redis) rather than compute, so side by side they finish in about half the time on
 * the same two cores. Shards share no state: each PostgreSQL shard has a fresh database created and
 * dropped here and a Redis DB index of its own, the embedded ones no Redis. Each shard's report is
 * printed whole when it ends, so none interleave.
 */
import { statSync } from 'node:fs'
import postgres from 'postgres'

const PG_ADMIN_URL = process.env.TEST_PG_ADMIN_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres'
const REDIS_BASE = process.env.TEST_REDIS_BASE ?? 'redis://127.0.0.1:6379'
/** The first PostgreSQL shard's Redis DB index; the others take the ones after it. */
const REDIS_DB = Number(process.env.TEST_REDIS_DB ?? '11')
const extraArgs = process.argv.slice(2)
// Arguments that name files or filters choose the tests themselves: one process a pass runs them.
const SHARDS = extraArgs.some((arg) => !arg.startsWith('-')) ? 1 : Number(process.env.TEST_SHARDS ?? '2')

interface Report {
  passed: number
  failed: number
  /** The suite's own `SKIPPED: …` warnings: tests it left out because this machine lacks a tool. */
  skipped: string[]
}

/**
 * The suite's files in `shards` lists of about equal bytes, largest first (the longest-running files
 * are among the largest, and a shard that gets one early is given fewer others); all of them, in the
 * one list, with one shard.
 */
function shardFiles(shards: number): string[][] {
  if (shards === 1) return [[]]
  const files = [...new Bun.Glob('test/**/*.test.ts').scanSync('.')].map((path) => ({ path: `./${path}`, bytes: statSync(path).size }))
  files.sort((a, b) => b.bytes - a.bytes || (a.path < b.path ? -1 : 1))
  const lists = Array.from({ length: shards }, () => ({ paths: [] as string[], bytes: 0 }))
  for (const file of files) {
    const lightest = lists.reduce((a, b) => (b.bytes < a.bytes ? b : a))
    lightest.paths.push(file.path)
    lightest.bytes += file.bytes
  }
  return lists.map((list) => list.paths)
}

async function runShard(name: string, files: string[], env: Record<string, string>): Promise<Report> {
  const proc = Bun.spawn([process.execPath, 'test', '--timeout', '30000', ...extraArgs, ...files], {
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
  // A shard that crashed before reporting counts as a failure even if no test did.
  const crashed = exitCode !== 0 && count('fail') === 0 ? 1 : 0
  return { passed: count('pass'), failed: count('fail') + crashed, skipped }
}

async function withFreshDatabase<T>(shard: number, fn: (url: string) => Promise<T>): Promise<T> {
  const name = `ls_test_${process.pid}_${Date.now()}_${shard}`
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

/** A shard whose set-up failed (PostgreSQL or Redis unreachable) counts as failed; the others still report. */
const crashed =
  (name: string) =>
  (err: unknown): Report => {
    console.log(`\n=== ${name} ===\ncould not run: ${err}`)
    return { passed: 0, failed: 1, skipped: [] }
  }

const shardName = (pass: string, shard: number) => (SHARDS === 1 ? pass : `${pass}, shard ${shard + 1} of ${SHARDS}`)

const REAL = 'PostgreSQL + Redis'
const EMBEDDED = 'embedded (PGlite + in-process store)'
const lists = shardFiles(SHARDS)
const realServers = lists.map((files, shard) =>
  withFreshDatabase(shard, async (databaseUrl) => {
    const redisUrl = `${REDIS_BASE}/${REDIS_DB + shard}`
    await flushRedis(redisUrl)
    try {
      return await runShard(shardName(REAL, shard), files, {
        TEST_DATABASE_URL: databaseUrl,
        TEST_REDIS_URL: redisUrl,
        TEST_REDIS_BASE: REDIS_BASE,
      })
    } finally {
      await flushRedis(redisUrl)
    }
  }).catch(crashed(shardName(REAL, shard))),
)
const embedded = lists.map((files, shard) => runShard(shardName(EMBEDDED, shard), files, { TEST_DATABASE_URL: '', TEST_REDIS_URL: '' }))
const passes = [
  { name: REAL, reports: await Promise.all(realServers) },
  { name: EMBEDDED, reports: await Promise.all(embedded) },
]

let passed = 0
let failed = 0
console.log('')
// Repeated here, where a reader of the counts looks: a machine without Go or Chromium passes with fewer tests.
for (const line of new Set(passes.flatMap((p) => p.reports.flatMap((r) => r.skipped)))) console.log(line)
for (const { name, reports } of passes) {
  const sum = (key: 'passed' | 'failed') => reports.reduce((total, r) => total + r[key], 0)
  console.log(`${name}: ${sum('passed')} passed, ${sum('failed')} failed`)
  passed += sum('passed')
  failed += sum('failed')
}
console.log(`${passed} passed, ${failed} failed`)
process.exit(failed > 0 ? 1 : 0)
