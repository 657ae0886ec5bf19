import { sql } from 'drizzle-orm'
import { rowsOf } from '../delivery/prepared'
import { errorFields, log } from '../lib/log'
import type { Db } from './client'

/** How often the embedded server does what PostgreSQL's own background processes would. */
export const UPKEEP_EVERY_MS = 5 * 60_000

/**
 * The tables autovacuum would vacuum or analyze now, by its default thresholds: dead rows past 50 +
 * 20% of the table, changes since the last analyze past 50 + 10% (reltuples is -1 before a first one).
 */
const DUE = sql`
  SELECT s.relname AS name,
    s.n_dead_tup > 50 + 0.2 * greatest(c.reltuples, 0) AS vacuum,
    s.n_mod_since_analyze > 50 + 0.1 * greatest(c.reltuples, 0) AS analyze
  FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
  WHERE s.schemaname = 'public'`

/**
 * What autovacuum would run now, on the tables its thresholds name. On the server's one thread, as
 * every PGlite statement is: a first vacuum of a million rows took 178 ms, an analyze of them 176, a
 * vacuum with nothing to do 1.
 */
export async function vacuumDueTables(db: Db): Promise<void> {
  for (const due of rowsOf(await db.execute(DUE))) {
    const table = sql.identifier(String(due.name))
    if (due.vacuum) await db.execute(due.analyze ? sql`VACUUM (ANALYZE) ${table}` : sql`VACUUM ${table}`)
    else if (due.analyze) await db.execute(sql`ANALYZE ${table}`)
  }
}

/**
 * PGlite runs PostgreSQL in single-user mode, which starts neither autovacuum nor the checkpointer. Without
 * the first, the room of deleted rows and of the old versions of updated ones was never reused (a table
 * that had 20,000 rows inserted and deleted grew by 5 MB each time, for good): the database grew with
 * every event, delivery and credit flush record it purged, and no table was ever analyzed. Without the
 * second, the write-ahead log was kept from the start to the stop: a 26-minute soak left 262 MB of it
 * beside 98 MB of data, growing 10 MB a minute, all of it replayed by the next start after a crash. A
 * checkpoint lets its segments be recycled (5 ms here after 20 MB written).
 */
export async function upkeep(db: Db): Promise<void> {
  await vacuumDueTables(db)
  await db.execute(sql`CHECKPOINT`)
}

/** Runs upkeep every UPKEEP_EVERY_MS; stop() ends that, waiting for one under way. */
export function startEmbeddedUpkeep(db: Db, everyMs = UPKEEP_EVERY_MS): { stop(): Promise<void> } {
  let running: Promise<void> | null = null
  const timer = setInterval(() => {
    running ??= upkeep(db)
      .catch((err: unknown) => log.warn('upkeep of the embedded database failed', errorFields(err)))
      .finally(() => {
        running = null
      })
  }, everyMs)
  timer.unref()
  return {
    async stop() {
      clearInterval(timer)
      await running
    },
  }
}
