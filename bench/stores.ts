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

export async function benchStores(adminUrl: string, redisUrl: string, name: string): Promise<BenchStores> {
  const admin = postgres(adminUrl, { max: 1, onnotice: () => {} })
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
