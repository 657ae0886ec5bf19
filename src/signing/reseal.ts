import { eq, sql } from 'drizzle-orm'
import { SERVER_CONNECTION_NAME } from '../config'
import { type Database, MIGRATION_LOCK, type Tx } from '../db/client'
import { signingKeys, webhooks } from '../db/schema'
import { rowsOf } from '../delivery/prepared'
import type { Sealer } from '../lib/crypto'
import { describeUnopened, KEY_MISMATCH, notOpening, sealedValues, storedKeyCheck, storeKeyCheck } from './key-check'

/**
 * Master-key rotation: every value sealed with the master key (signing private keys and webhook
 * secrets, the only two; session tokens and list cursors use a key derived from it and are not
 * stored) opened with the current key and sealed with the new one, and the key check value replaced,
 * in one transaction.
 */

export interface Resealed {
  signingKeys: number
  webhookSecrets: number
}

/** A rotation that did not happen, and changed nothing: the message says why. */
export class ResealRefused extends Error {}

/** The counts re-sealed, or null when the database is already sealed with `to` (a rotation that committed before). */
export async function resealAll(database: Database, from: Sealer, to: Sealer): Promise<Resealed | null> {
  return database.db.transaction(async (tx) => {
    // A server starting from here on waits at its migration (this lock). One already past it reads the
    // check row FOR SHARE at start (adoptKeyCheck), and the row is taken here before the count: it has
    // either read the row and is connected, so counted below, or waits for the commit and then refuses
    // the old key. A sealing transaction takes this row (FOR SHARE) before it writes, so the two queue
    // here instead of deadlocking.
    if (database.kind === 'postgres') await tx.execute(sql.raw(`SELECT pg_advisory_xact_lock(${MIGRATION_LOCK})`))
    const stored = await storedKeyCheck(tx, 'update')
    // Done already: servers running now run on the new key, and nothing is re-sealed.
    if (stored === to.check) return null
    // Before the table lock, which would otherwise wait behind a running server's transaction.
    if (database.kind === 'postgres') await refuseWhileServersConnected(tx)
    if (stored !== null && stored !== from.check) throw new ResealRefused(`${KEY_MISMATCH}; nothing was changed`)
    // A writer (a signing-key rotation, a new webhook) waits until the commit, so what is read here
    // is all there is to re-seal.
    await tx.execute(sql`LOCK TABLE ${signingKeys}, ${webhooks} IN EXCLUSIVE MODE`)
    const { keys, hooks } = await sealedValues(tx)
    // Every value is opened before the first write: one that does not open stops the rotation whole.
    const unopened = notOpening({ keys, hooks }, from)
    if (unopened.length > 0) {
      throw new ResealRefused(`${describeUnopened(unopened, 'the current master key')}; nothing was changed`)
    }
    for (const row of keys) {
      await tx.update(signingKeys).set({ privateKeyEnc: to.seal(from.open(row.sealed)) }).where(eq(signingKeys.id, row.id))
    }
    for (const row of hooks) {
      await tx.update(webhooks).set({ secretEnc: to.seal(from.open(row.sealed)) }).where(eq(webhooks.id, row.id))
    }
    await storeKeyCheck(tx, to.check)
    // Counted again at the end: a running server whose connections had all dropped (a restart of
    // PostgreSQL, a network cut) is seen once it reconnects. One that reconnects after the commit
    // notices the new check value (watchKeyCheck) and stops.
    if (database.kind === 'postgres') await refuseWhileServersConnected(tx)
    return { signingKeys: keys.length, webhookSecrets: hooks.length }
  })
}

/**
 * A server keeps the old key in memory and would seal new values with it after the commit, and fail
 * to open the re-sealed ones: with PostgreSQL shared by instances the data-dir lock says nothing, but
 * each server's connections carry their application_name.
 */
async function refuseWhileServersConnected(tx: Tx): Promise<void> {
  // pg_stat_activity is read once per transaction and kept (stats_fetch_consistency): a second count
  // would see the first one's connections, not the ones opened since.
  await tx.execute(sql`SELECT pg_stat_clear_snapshot()`)
  const result = await tx.execute(sql`
    SELECT count(*)::int AS n FROM pg_stat_activity
    WHERE datname = current_database() AND application_name = ${SERVER_CONNECTION_NAME} AND pid <> pg_backend_pid()`)
  const connected = Number(rowsOf(result)[0]?.n ?? 0)
  if (connected > 0) {
    throw new ResealRefused(
      `${connected} connection(s) of a running server or CLI are open on the database: stop every server, rotate, then start them with MASTER_KEY set to the new key`,
    )
  }
}
