import { sql } from 'drizzle-orm'
import { rowsOf } from '../delivery/prepared'
import { errorFields, log } from '../lib/log'
import type { Db } from './client'

/** How often the embedded server looks for tables to vacuum or analyze. */
export const VACUUM_EVERY_MS = 10 * 60_000

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
 * PGlite runs PostgreSQL in single-user mode, which starts no autovacuum: the space of deleted rows and
 * of the old versions of updated ones was never reused (a table that had 20,000 rows inserted and
 * deleted grew by 5 MB each time, for good), so an embedded server's database grew with every event,
 * delivery and credit flush record it purged, and its statistics were never gathered. This runs what
 * autovacuum would, every VACUUM_EVERY_MS, on the tables its thresholds name. On the server's one
 * thread, as every PGlite statement is: a first vacuum of a million rows took 178 ms, an analyze of
 * them 176, a vacuum with nothing to do 1.
 */
export async function vacuumDueTables(db: Db): Promise<void> {
  for (const due of rowsOf(await db.execute(DUE))) {
    const table = sql.identifier(String(due.name))
    if (due.vacuum) await db.execute(due.analyze ? sql`VACUUM (ANALYZE) ${table}` : sql`VACUUM ${table}`)
    else if (due.analyze) await db.execute(sql`ANALYZE ${table}`)
  }
}

/** Starts the embedded database's vacuums; stop() ends them, waiting for one under way. */
export function startEmbeddedVacuum(db: Db, everyMs = VACUUM_EVERY_MS): { stop(): Promise<void> } {
  let running: Promise<void> | null = null
  const timer = setInterval(() => {
    running ??= vacuumDueTables(db)
      .catch((err: unknown) => log.warn('vacuuming the embedded database failed', errorFields(err)))
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
