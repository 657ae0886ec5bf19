import { expect, test } from 'bun:test'
import { mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { sql } from 'drizzle-orm'
import { openDb, pgliteDir } from '../../src/db/client'
import { upkeep, vacuumDueTables } from '../../src/db/embedded-upkeep'
import { rowsOf } from '../../src/delivery/prepared'

test('an embedded database reuses the room of deleted rows once its due tables are vacuumed, as autovacuum would have', async () => {
  const database = await openDb({ databaseUrl: null, dataDir: null })
  try {
    const { db } = database
    const one = async (query: ReturnType<typeof sql>) => rowsOf(await db.execute(query))[0] ?? {}
    await db.execute(sql`CREATE TABLE churn (id serial PRIMARY KEY, data text NOT NULL)`)
    const round = async () => {
      await db.execute(sql`INSERT INTO churn (data) SELECT repeat('x', 200) FROM generate_series(1, 20000)`)
      await db.execute(sql`DELETE FROM churn`)
      // The statistics the thresholds read are reported when a transaction ends, a second apart at most.
      await db.execute(sql`SELECT pg_stat_force_next_flush()`)
      await db.execute(sql`SELECT 1`)
      return Number((await one(sql`SELECT pg_total_relation_size('churn') AS n`)).n)
    }
    const first = await round()
    // Without a vacuum (PGlite starts no autovacuum), the deleted rows' room is never taken again.
    expect(await round()).toBeGreaterThan(first * 1.8)
    await vacuumDueTables(db)
    const vacuumed = await round()
    await vacuumDueTables(db)
    expect(await round()).toBeLessThan(vacuumed * 1.1)
    expect(await one(sql`SELECT last_vacuum IS NOT NULL AS vacuumed, last_analyze IS NOT NULL AS analyzed FROM pg_stat_user_tables WHERE relname = 'churn'`)).toEqual({
      vacuumed: true,
      analyzed: true,
    })
  } finally {
    await database.close()
  }
})

test('the write-ahead log of an embedded database stays bounded under upkeep, as checkpoints would keep it', async () => {
  const dataDir = mkdtempSync(join(tmpdir(), 'ls-upkeep-'))
  const database = await openDb({ databaseUrl: null, dataDir })
  try {
    const { db } = database
    const segments = () => readdirSync(join(pgliteDir(dataDir), 'pg_wal')).filter((name) => /^[0-9A-F]{24}$/.test(name)).length
    await db.execute(sql`CREATE TABLE churn (id bigserial PRIMARY KEY, data text NOT NULL)`)
    // About 25 MB of WAL a round.
    const round = async () => {
      await db.execute(sql`INSERT INTO churn (data) SELECT repeat('x', 500) FROM generate_series(1, 40000)`)
      await db.execute(sql`DELETE FROM churn`)
    }
    const start = segments()
    for (let i = 0; i < 4; i++) await round()
    // Single-user PostgreSQL never checkpoints on its own: every segment since the start is kept.
    const unkept = segments()
    expect(unkept).toBeGreaterThanOrEqual(start + 5)
    // Twice that written again, with upkeep after each round: the segments are recycled, not added.
    const withUpkeep = async (rounds: number) => {
      for (let i = 0; i < rounds; i++) {
        await round()
        await upkeep(db)
      }
      return segments()
    }
    const settled = await withUpkeep(4)
    expect(settled).toBeLessThanOrEqual(unkept + 2)
    expect(await withUpkeep(4)).toBeLessThanOrEqual(settled)
  } finally {
    await database.close()
    rmSync(dataDir, { recursive: true, force: true })
  }
})
