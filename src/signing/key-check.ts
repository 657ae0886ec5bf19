import { eq } from 'drizzle-orm'
import { ConfigError } from '../config'
import type { Database, DbOrTx } from '../db/client'
import { masterKeyCheck, signingKeys, webhooks } from '../db/schema'
import { SealError, type Sealer } from '../lib/crypto'
import { log } from '../lib/log'
import type { DatabaseSeal } from './master-key'

/**
 * The database records which master key its secrets are sealed with (a check value, never the key):
 * a server or CLI with another key refuses to start instead of failing every signature later, and a
 * server that missed a rotation cannot seal a new secret with the old key.
 */

export const KEY_MISMATCH = "MASTER_KEY does not match the key this database's secrets are sealed with"

/** A settings problem: the process was started with the wrong key. */
export class MasterKeyMismatch extends ConfigError {}

/** The stored check value, null before the first start of a version that keeps one. */
export async function storedKeyCheck(db: DbOrTx, lock?: 'share' | 'update'): Promise<string | null> {
  const query = db.select({ value: masterKeyCheck.value }).from(masterKeyCheck).where(eq(masterKeyCheck.id, 1))
  const [row] = await (lock ? query.for(lock) : query)
  return row?.value ?? null
}

/** Writes the check value, or replaces it (a rotation), in the caller's transaction. */
export async function storeKeyCheck(tx: DbOrTx, value: string): Promise<void> {
  await tx
    .insert(masterKeyCheck)
    .values({ id: 1, value })
    .onConflictDoUpdate({ target: masterKeyCheck.id, set: { value, updatedAt: new Date() } })
}

/**
 * At start: the stored check value must be this key's. A database without one (a first start, or an
 * upgrade from a version that kept none) gets this key's, but only once every value already sealed
 * there opens with it.
 */
export async function adoptKeyCheck(database: Database, sealer: Sealer): Promise<void> {
  // Read FOR SHARE: a rotation under way holds the row FOR UPDATE until its commit, so a server
  // starting meanwhile reads the new value and refuses, instead of starting on the old key.
  const stored = await database.db.transaction((tx) => storedKeyCheck(tx, 'share'))
  if (stored === null) {
    await database.db.transaction(async (tx) => {
      const unopened = await unopenedValues(tx, sealer)
      if (unopened.length > 0) throw new MasterKeyMismatch(`${KEY_MISMATCH}: ${describeUnopened(unopened, 'it')}`)
      // Another process starting meanwhile may have written its own first: compared below.
      await tx.insert(masterKeyCheck).values({ id: 1, value: sealer.check }).onConflictDoNothing()
    })
  }
  if ((stored ?? (await storedKeyCheck(database.db))) !== sealer.check) throw new MasterKeyMismatch(KEY_MISMATCH)
}

/**
 * In a transaction about to seal a new secret: holds the check row (FOR SHARE) until the commit, so a
 * rotation, which rewrites the row, waits for this transaction or makes it refuse.
 */
export async function requireSealingKey(tx: DbOrTx, sealer: Sealer): Promise<void> {
  if ((await storedKeyCheck(tx, 'share')) === sealer.check) return
  log.error(`${KEY_MISMATCH}: refusing to seal a new secret; restart this server with the current MASTER_KEY`)
  throw new MasterKeyMismatch(KEY_MISMATCH)
}

/** How often a running server reads the stored check value (watchKeyCheck). */
export const KEY_WATCH_MS = 5_000

/**
 * Calls `rotated` once the stored check value is no longer `sealer`'s: a rotation that committed while
 * this server ran (one whose connections had all dropped when the rotation counted them) left it with
 * a key that opens nothing re-sealed and may seal nothing new. A read that fails is tried again.
 */
export function watchKeyCheck(database: Database, sealer: Sealer, rotated: () => void, everyMs = KEY_WATCH_MS): { stop(): void } {
  let reading = false
  const timer = setInterval(async () => {
    if (reading) return
    reading = true
    try {
      const stored = await storedKeyCheck(database.db)
      if (stored !== null && stored !== sealer.check) {
        clearInterval(timer)
        log.error(`${KEY_MISMATCH}: the master key was rotated while this server ran; start it again with MASTER_KEY set to the new key`)
        rotated()
      }
    } catch {
      // Unreachable database: the next read tries again.
    } finally {
      reading = false
    }
  }, everyMs)
  timer.unref?.()
  return { stop: () => clearInterval(timer) }
}

/** How many of the values that do not open are named in a refusal. */
const NAMED_FAILURES = 5

export interface SealedRow {
  id: string
  sealed: string
}

/** What the database says of its key, for resolveMasterKey: a database without a check value may still hold values an earlier version sealed. */
export async function databaseSeal(db: DbOrTx): Promise<DatabaseSeal> {
  const check = await storedKeyCheck(db)
  if (check !== null) return { check, sealed: true }
  const [key] = await db.select({ id: signingKeys.id }).from(signingKeys).limit(1)
  const [hook] = key ? [] : await db.select({ id: webhooks.id }).from(webhooks).limit(1)
  return { check, sealed: key !== undefined || hook !== undefined }
}

/** Every sealed value in the database, by kind. */
export async function sealedValues(db: DbOrTx): Promise<{ keys: SealedRow[]; hooks: SealedRow[] }> {
  return {
    keys: await db.select({ id: signingKeys.id, sealed: signingKeys.privateKeyEnc }).from(signingKeys),
    hooks: await db.select({ id: webhooks.id, sealed: webhooks.secretEnc }).from(webhooks),
  }
}

/** The values of `rows` that `sealer` does not open, named for an operator. */
export function notOpening(rows: { keys: SealedRow[]; hooks: SealedRow[] }, sealer: Sealer): string[] {
  const failing = (list: SealedRow[], what: string) =>
    list.flatMap((row) => {
      try {
        sealer.open(row.sealed)
        return []
      } catch (err) {
        if (!(err instanceof SealError)) throw err
        return [`${what} ${row.id}`]
      }
    })
  return [...failing(rows.keys, 'signing key'), ...failing(rows.hooks, 'webhook')]
}

const unopenedValues = async (db: DbOrTx, sealer: Sealer) => notOpening(await sealedValues(db), sealer)

export function describeUnopened(unopened: string[], key: string): string {
  const named = unopened.slice(0, NAMED_FAILURES).join(', ')
  const rest = unopened.length > NAMED_FAILURES ? ` and ${unopened.length - NAMED_FAILURES} more` : ''
  return `${unopened.length} sealed value(s) do not open with ${key} (${named}${rest})`
}
