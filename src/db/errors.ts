import { DrizzleQueryError } from 'drizzle-orm'
import { databaseErrors } from '../lib/metrics'

export const SQLSTATE = /^[0-9A-Z]{5}$/
// postgres.js's own codes (CONNECTION_CLOSED, CONNECT_TIMEOUT, …) and socket errnos (ECONNREFUSED): a bounded set.
const DRIVER_CODE = /^(CONNECT[A-Z_]*|E[A-Z]{2,20})$/

/** The first error in the `cause` chain that carries a code (drizzle wraps the driver's error). */
export function codedError(err: unknown): { code: string; syscall: boolean } | undefined {
  for (let e = err, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    const { code, syscall } = e as { code?: unknown; syscall?: unknown }
    if (typeof code === 'string') return { code, syscall: syscall !== undefined }
  }
  return undefined
}

/**
 * A SQLSTATE from PostgreSQL or PGlite, a postgres.js connection code (CONNECTION_CLOSED,
 * CONNECT_TIMEOUT) or a socket errno (ECONNREFUSED): safe for a log line, unlike the messages, where
 * drizzle puts the statement's parameters.
 */
export function errorCode(err: unknown): string | undefined {
  return codedError(err)?.code
}

/** Whether a failure came from the database: drizzle wraps every query's error, the driver's as its cause. */
export function isDatabaseError(err: unknown): boolean {
  for (let e = err, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    if (e instanceof DrizzleQueryError) return true
  }
  return false
}

/** Counts a database failure in database_errors_total, by SQLSTATE class (two characters) or driver code. */
export function countDatabaseError(err: unknown): void {
  const code = errorCode(err)
  databaseErrors.add(code === undefined ? 'other' : SQLSTATE.test(code) ? code.slice(0, 2) : DRIVER_CODE.test(code) ? code : 'other')
}
