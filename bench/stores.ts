import Redis from 'ioredis'
import postgres from 'postgres'

/** The middle of `list` (the mean of the two middle values for an even count). */
export function median(list: number[]): number {
  const sorted = [...list].sort((a, b) => a - b)
  const mid = sorted.length >> 1
  return sorted.length % 2 ? (sorted[mid] as number) : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2
}

/** One bench run's PostgreSQL database (created here) and Redis database (flushed), and their removal. */
export interface BenchStores {
  databaseUrl: string
  /** A connection to the admin database, for reading server-side figures during the run. */
  admin: postgres.Sql
  redis: Redis
  /** Flushes the Redis database and drops the PostgreSQL one. */
  close(): Promise<void>
}

/** Whether process `pid` runs on this machine (a pid reused since reads as running: nothing is lost). */
function running(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM'
  }
}

/**
 * Drops the databases of benches killed before they dropped their own (a million licenses is ~0.5 GB
 * of disk a run): named `ls_bench…_<pid>` with no such process. Only on a PostgreSQL of this machine,
 * the only one whose benches' pids this machine can tell apart.
 */
async function dropAbandoned(admin: postgres.Sql, adminUrl: string): Promise<void> {
  if (!['127.0.0.1', 'localhost', '[::1]', ''].includes(new URL(adminUrl).hostname)) return
  const rows = await admin<{ datname: string }[]>`SELECT datname FROM pg_database WHERE datname ~ '^ls_bench[a-z_]*_[0-9]+$'`
  for (const { datname } of rows) {
    if (running(Number(datname.slice(datname.lastIndexOf('_') + 1)))) continue
    await admin.unsafe(`DROP DATABASE IF EXISTS ${datname} WITH (FORCE)`)
    console.log(`dropped ${datname}, left by a bench that no longer runs`)
  }
}

export async function benchStores(adminUrl: string, redisUrl: string, name: string): Promise<BenchStores> {
  const admin = postgres(adminUrl, { max: 1, onnotice: () => {} })
  await dropAbandoned(admin, adminUrl)
  await admin.unsafe(`CREATE DATABASE ${name}`)
  const url = new URL(adminUrl)
  url.pathname = `/${name}`
  const redis = new Redis(redisUrl)
  await redis.flushdb()
  return {
    databaseUrl: url.toString(),
    admin,
    redis,
    async close() {
      await redis.flushdb()
      redis.disconnect()
      await admin.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
      await admin.end()
    },
  }
}

/**
 * Readies the bench's Redis database for `arrivals` new keys (a run's nonces) with no resize of its key
 * tables while anything is measured. Redis doubles a table once it holds as many keys as it has slots
 * and then moves the keys over while serving: for the seconds that takes its CPU per validate measured
 * ~50% higher (17 → 23–27 µs), an outlier round for whichever scenario ran then. So the database is
 * filled just past a power of two with keys that expire in a week, as a server's week of nonces would,
 * each read once after (a read moves a slot, which completes the move), and the run's keys fit in the
 * room left. A production Redis holding a week of nonces is at least as large, and a larger table costs
 * a little more per lookup (~20 µs of Redis per validate here, ~17 near empty): closer to production too.
 */
export async function presizeKeyspace(redis: Redis, arrivals: number): Promise<void> {
  const half = 2 ** Math.ceil(Math.log2(Math.max(arrivals, 1)))
  // ~140 bytes a key here (key, value, both tables): a Redis with less room would refuse the fill or
  // evict the server's own keys for it.
  const room = await redis.config('GET', 'maxmemory').then(
    (reply) => Number((reply as string[])[1] ?? 0),
    () => 0,
  )
  if (room > 0 && room < half * 140 * 1.5) {
    console.log(`Redis maxmemory ${room} bytes leaves no room for ${half} keys: measuring without filling it first`)
    return
  }
  const each = (command: string) => `for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do ${command} end`
  const steps = [each("redis.call('SET', 'bench:filler:' .. i, '1', 'EX', 604800)"), each("redis.call('EXISTS', 'bench:filler:' .. i)")]
  for (const script of steps) {
    for (let from = 0; from <= half; from += 100_000) await redis.eval(script, 0, from, Math.min(half, from + 99_999))
  }
}
