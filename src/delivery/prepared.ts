import type { SQL } from 'drizzle-orm'
import type { DbOrTx } from '../db/client'

interface Internals {
  session: { prepareQuery(query: unknown, fields: undefined, name: string, arrayMode: boolean): { execute(): Promise<unknown> } }
  dialect: { sqlToQuery(query: SQL): unknown }
}

/**
 * Runs a raw statement as a named prepared statement: what `db.execute` does, except that the
 * postgres driver then parses and plans it once per connection instead of on every call. Only for
 * statements whose text never changes (values go in as parameters): the webhook outbox's statements
 * run several hundred times a second under load, and planning their CTEs cost more server CPU than
 * executing them. PGlite ignores the name. Same result shape as `db.execute`.
 */
export function executePrepared(db: DbOrTx, name: string, query: SQL): Promise<unknown> {
  const { session, dialect } = db as unknown as Internals
  return session.prepareQuery(dialect.sqlToQuery(query), undefined, name, false).execute()
}

/** The rows of a raw statement's result: postgres.js returns the rows themselves, PGlite an object holding them. */
export function rowsOf(result: unknown): Record<string, unknown>[] {
  return (Array.isArray(result) ? result : (result as { rows?: unknown[] }).rows ?? []) as Record<string, unknown>[]
}
