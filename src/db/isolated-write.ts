/**
 * Batched writes share a statement or a transaction, never a fate: when PostgreSQL refuses one
 * member's data the batch is split until that member stands alone, and when the database cannot be
 * reached the caller learns which members were not written, so it can keep them for a retry.
 */
import { codedError, countDatabaseError, SQLSTATE } from './errors'

/** What went wrong with a write, as far as the batch is concerned. */
export type WriteFailure =
  /** Connection refused or lost, server shutting down, out of resources, a transient conflict: try again later. */
  | 'outage'
  /** PostgreSQL refused a value (data exception, constraint, size limit): some member's own data. */
  | 'data'
  /**
   * A lock not granted in time (lock_timeout: another session holds a row or table): transient, and
   * on a row lock some member's own row.
   */
  | 'contention'
  /** Anything else (a statement or programming error): no member is to blame and a retry would not help. */
  | 'failure'

// SQLSTATE classes: 08 connection exception, 40 transaction rollback (serialization, deadlock),
// 53 insufficient resources, 57 operator intervention (admin shutdown, cannot connect now), 58 system error.
const OUTAGE_CLASSES = new Set(['08', '40', '53', '57', '58'])
// And codes: 25006 read_only_sql_transaction, a server that takes no writes for now (a failover that
// left the connection on a standby, a primary in recovery); 25P03 idle_in_transaction_session_timeout,
// a session the server ended.
const OUTAGE_CODES = new Set(['25006', '25P03'])
/** 55P03 lock_not_available: lock_timeout passed (LOCK_WAIT in client.ts). */
const CONTENTION = '55P03'
// 22 data exception (bad encoding, NUL, invalid JSON), 23 integrity constraint, 54 program limit (a value too large).
const DATA_CLASSES = new Set(['22', '23', '54'])

export function classifyWriteError(err: unknown): WriteFailure {
  const coded = codedError(err)
  if (!coded) return 'failure'
  // A failed socket call, or postgres.js's CONNECTION_CLOSED/_DESTROYED/_ENDED and CONNECT_TIMEOUT.
  if (coded.syscall || coded.code.startsWith('CONNECT')) return 'outage'
  if (!SQLSTATE.test(coded.code)) return 'failure'
  const cls = coded.code.slice(0, 2)
  if (OUTAGE_CLASSES.has(cls) || OUTAGE_CODES.has(coded.code)) return 'outage'
  if (coded.code === CONTENTION) return 'contention'
  return DATA_CLASSES.has(cls) ? 'data' : 'failure'
}

export interface IsolatedWrite<T> {
  /** Members that were not written and never will be as they are, each with its error. */
  refused: { member: T; error: unknown; failure: Exclude<WriteFailure, 'outage'> }[]
  /** Members not written because the database was unreachable, in their original order. */
  unwritten: T[]
  /** The error that stopped the write when the database was unreachable. */
  outage: unknown
}

/**
 * Writes `members` with one call of `write` (a statement or a transaction over all of them). When
 * PostgreSQL refuses some member's data, each half is written on its own, recursively: k bad
 * members among n cost about 2·k·log2(n) extra statements, and every other member is written. At
 * the first outage the rest is left unwritten (what was written stays written). `write` must apply
 * nothing, or only its own transaction's changes, when it throws. A lock not granted in time is split
 * off the same way when `contention` is 'isolate' (each member updates rows of its own: one locked
 * elsewhere fails alone), and is an outage when it is 'outage' (a table's lock: every part would wait).
 */
export async function writeIsolated<T>(
  members: readonly T[],
  write: (part: readonly T[]) => Promise<void>,
  contention: 'isolate' | 'outage',
): Promise<IsolatedWrite<T>> {
  const result: IsolatedWrite<T> = { refused: [], unwritten: [], outage: undefined }
  let unreachable = false
  const attempt = async (part: readonly T[]): Promise<void> => {
    if (unreachable) {
      result.unwritten = result.unwritten.concat(part)
      return
    }
    try {
      await write(part)
    } catch (error) {
      countDatabaseError(error)
      const classified = classifyWriteError(error)
      const failure = classified === 'contention' && contention === 'outage' ? 'outage' : classified
      if (failure === 'outage') {
        unreachable = true
        result.outage = error
        result.unwritten = result.unwritten.concat(part)
      } else if ((failure === 'data' || failure === 'contention') && part.length > 1) {
        const half = part.length >> 1
        await attempt(part.slice(0, half))
        await attempt(part.slice(half))
      } else {
        for (const member of part) result.refused.push({ member, error, failure })
      }
    }
  }
  await attempt(members)
  return result
}
