/**
 * A COMMIT whose answer is lost with its connection may have committed or not: the client cannot tell
 * from the error. PostgreSQL can, by the transaction's id read inside it (pg_current_xact_id) and
 * asked for afterwards on another connection (pg_xact_status): one outside the request pool, whose
 * queue fills in just the outages that lose answers.
 */
import { sql } from 'drizzle-orm'
import { rowsOf } from '../delivery/prepared'
import { log } from '../lib/log'
import { withDeadline } from '../lib/with-timeout'
import { type Ask, type Database, LOCK_WAIT, type Tx } from './client'
import { errorCode } from './errors'
import { classifyWriteError } from './isolated-write'

/**
 * A transaction's lock wait (LOCK_WAIT, set for the transaction alone): past it the statement fails
 * with 55P03, and the write fails alone or is retried (isolated-write.ts), instead of holding up an
 * app's mailbox, or every account's credit flush, for as long as the other session (an operator's, a
 * migration's) keeps its lock.
 */
const TRANSACTION_LOCK_WAIT = sql`set_config('lock_timeout', ${LOCK_WAIT}, true)`

/** Sets the transaction's lock wait (TRANSACTION_LOCK_WAIT). */
export async function limitLockWait(tx: Tx): Promise<void> {
  await tx.execute(sql`SELECT ${TRANSACTION_LOCK_WAIT}`)
}

/**
 * A transaction as its fate can be asked for: its id, and when the server that gave it out started.
 * PostgreSQL gives an id that never reached its log out again after a crash, and a promoted standby
 * one the old primary gave out: asked of a server started since, the id may name another transaction.
 */
export interface TransactionMark {
  xid: string
  serverStarted: string
}

/** Sets the transaction's lock wait (TRANSACTION_LOCK_WAIT) and returns its mark (an id is assigned if it had none yet). */
export async function startTransaction(tx: Tx): Promise<TransactionMark> {
  const [row] = rowsOf(await tx.execute(sql`SELECT pg_current_xact_id()::text AS xid, pg_postmaster_start_time()::text AS started, ${TRANSACTION_LOCK_WAIT}`))
  return { xid: String(row?.xid), serverStarted: String(row?.started) }
}

/**
 * What became of the marked transaction, asked on a connection `Database.aside` holds: 'in progress'
 * while a backend that has not noticed its client is gone still holds it open; 'not committed' when it
 * aborted, or is too old to have a status; 'unknown' when the server restarted or is another since
 * (its id may have gone to another transaction). Throws when the database cannot be asked.
 */
export async function transactionStatus(ask: Ask, mark: TransactionMark): Promise<'committed' | 'in progress' | 'not committed' | 'unknown'> {
  let rows: Record<string, unknown>[]
  try {
    rows = await ask('SELECT pg_xact_status($1::xid8) AS status, pg_postmaster_start_time()::text AS started', [mark.xid])
  } catch (err) {
    if (classifyWriteError(err) === 'outage') throw err
    return 'not committed'
  }
  const [row] = rows
  if (String(row?.started) !== mark.serverStarted) return 'unknown'
  const status = row?.status
  return status === 'committed' || status === 'in progress' ? status : 'not committed'
}

/** How long a caller waiting for its answer asks about a transaction still in progress, and how often. */
const OPEN_WAIT_MS = 2_000
const OPEN_ASK_EVERY_MS = 100

/**
 * Runs `work` in a transaction and returns its result once committed, also when the COMMIT's answer was
 * lost but PostgreSQL says it committed: answered as failed, a change that took effect would be
 * refunded, retried or reported wrong (a seat bound to a device told its login failed). Any other
 * failure is thrown as it came, and so is a lost answer whose transaction did not commit, stayed open
 * past OPEN_WAIT_MS, could not be asked about or was asked of a server started since: then nothing
 * says it took effect.
 */
export async function transactionKnown<T>(database: Database, work: (tx: Tx) => Promise<T>): Promise<T> {
  let mark: TransactionMark | null = null
  let done = null as { result: T } | null
  try {
    return await database.db.transaction(async (tx) => {
      mark = await startTransaction(tx)
      const result = await work(tx)
      done = { result }
      return result
    })
  } catch (err) {
    // Only a COMMIT leaves its outcome open: `work` ran to its end and the connection went.
    if (mark === null || done === null || classifyWriteError(err) !== 'outage') throw err
    if ((await settledStatus(database, mark)) !== 'committed') throw err
    log.warn('a transaction whose answer was lost had committed', { code: errorCode(err) })
    return done.result
  }
}

/** What PostgreSQL says of the marked transaction within OPEN_WAIT_MS, each question included: 'unknown' when it cannot tell. */
function settledStatus(database: Database, mark: TransactionMark): Promise<string> {
  // A duration: a wall clock stepped back mid-wait would stretch it by the step.
  const giveUpAt = performance.now() + OPEN_WAIT_MS
  return database.aside(async (ask) => {
    for (;;) {
      let status: string
      try {
        // A server that stopped answering would hold the question up to the driver's connect timeout.
        status = await withDeadline(transactionStatus(ask, mark), Math.max(1, giveUpAt - performance.now()), 'the question')
      } catch {
        return 'unknown'
      }
      if (status !== 'in progress' || performance.now() >= giveUpAt) return status
      await Bun.sleep(OPEN_ASK_EVERY_MS)
    }
  }).catch(() => 'unknown')
}
