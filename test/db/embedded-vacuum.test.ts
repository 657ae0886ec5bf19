import { expect, test } from 'bun:test'
import { sql } from 'drizzle-orm'
import { openDb } from '../../src/db/client'
import { vacuumDueTables } from '../../src/db/embedded-vacuum'
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
