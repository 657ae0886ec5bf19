import { existsSync } from 'node:fs'
import { type Config, masterKeyFrom } from '../config'
import { describeHolder, isLock, LOCK_WAIT_MS, lockDataDir, mayLetGo } from '../db/data-dir-lock'
import { COMMAND_SHARED_BUFFERS_MB, type Database, openDb } from '../db/client'
import { Sealer } from '../lib/crypto'
import { storedKeyCheck } from '../signing/key-check'
import { currentMasterKey, finishPendingRotation, pendingKeyPath, stageDevelopmentKey } from '../signing/master-key'
import { type Resealed, resealAll, ResealRefused } from '../signing/reseal'
import { OperatorError, Refused } from './args'
import { usesOperatorSocket } from './socket'
import { operatorSocketAnswers, operatorSocketPath } from '../db/operator-socket'

export interface Rotation {
  rotated: Resealed
  /** The database was sealed with NEW_MASTER_KEY already (a rotation that committed earlier): nothing re-sealed. */
  alreadyRotated: boolean
  developmentKeyFile: string | null
}

/**
 * `master-key rotate`: the new key only from the environment (a command line shows in `ps`), the
 * current one as a server would find it. Never through a running server, which keeps the old key in
 * memory: one answering on the operator socket or holding DATA_DIR makes it refuse, and so do a
 * PostgreSQL-backed server's open connections (src/signing/reseal.ts).
 */
export async function rotateMasterKey(config: Readonly<Config>, env: Record<string, string | undefined>): Promise<Rotation> {
  const next = masterKeyFrom(env, 'NEW_MASTER_KEY')
  if (!next) {
    throw new OperatorError('NEW_MASTER_KEY is not set: put the new key there (64 hex characters or base64 of 32 bytes), not on the command line')
  }
  const current = currentMasterKey(config.masterKey, config.dataDir)
  if (!current) {
    throw new OperatorError('there is no master key to rotate from: MASTER_KEY is not set and DATA_DIR holds no development key')
  }

  // The socket first: a server in another container (another pid namespace) holds DATA_DIR too, and
  // only its answer shows it.
  if (await operatorSocketAnswers(operatorSocketPath(config.dataDir))) {
    throw new Refused(`a server answers on ${operatorSocketPath(config.dataDir)}: stop it before rotating the master key`)
  }
  let release = () => {}
  if (usesOperatorSocket(config)) {
    // Another CLI lets go within seconds; a server of this namespace never does.
    const lock = await lockDataDir(config.dataDir, 'cli', LOCK_WAIT_MS, mayLetGo)
    if (!isLock(lock)) throw new Refused(`${describeHolder(config.dataDir, lock)}: stop it before rotating the master key`)
    release = lock.release
  }
  try {
    const database = await openDb({ databaseUrl: config.databaseUrl, dataDir: config.dataDir, poolSize: 1, sharedBuffersMb: COMMAND_SHARED_BUFFERS_MB })
    try {
      return await rotateOpen(database, current, next)
    } finally {
      // After the key is in place: the rotation has committed whatever closing does.
      await database.close().catch(() => {})
    }
  } finally {
    release()
  }
}

async function rotateOpen(database: Database, current: { key: Buffer; file: string | null }, next: Buffer): Promise<Rotation> {
  const { file } = current
  if (current.key.equals(next)) {
    // Run again once the new key is in place (in MASTER_KEY, or the development key file the first run
    // replaced): the rotation committed, and there is nothing left to do.
    if ((await storedKeyCheck(database.db)) === new Sealer(next).check) {
      return { rotated: { signingKeys: 0, webhookSecrets: 0 }, alreadyRotated: true, developmentKeyFile: file }
    }
    throw new OperatorError('NEW_MASTER_KEY is the current master key')
  }
  let from = current.key
  if (file) {
    // A key staged by an earlier run is the only copy of a key the database may be sealed with.
    const finished = finishPendingRotation(file, await storedKeyCheck(database.db))
    if (finished) from = finished
    else if (existsSync(pendingKeyPath(file))) {
      throw new Refused(
        `${pendingKeyPath(file)} is left by a rotation that did not commit (the database is not sealed with it): move it out of DATA_DIR, then rotate again`,
      )
    }
  }
  // Written before the commit, put in place after it: the file and the data change together.
  const staged = file && !from.equals(next) ? stageDevelopmentKey(file, next) : null
  let rotated: Resealed | null
  try {
    rotated = await resealAll(database, new Sealer(from), new Sealer(next))
  } catch (err) {
    // Only a refusal proves nothing committed; after any other failure the staged key may be the
    // database's, and the next start or rotation puts it in place if it is.
    if (err instanceof ResealRefused) staged?.discard()
    throw err
  }
  if (staged) {
    try {
      staged.install()
    } catch {
      throw new Refused(
        `the values are sealed with NEW_MASTER_KEY, but ${file} could not be replaced (the new key is in ${staged.staged}, which the next start puts in place)`,
      )
    }
  }
  return { rotated: rotated ?? { signingKeys: 0, webhookSecrets: 0 }, alreadyRotated: rotated === null, developmentKeyFile: file }
}
