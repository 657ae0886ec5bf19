import { type Config, masterKeyFrom } from '../config'
import { describeHolder, isLock, LOCK_WAIT_MS, lockDataDir } from '../db/data-dir-lock'
import { openDb } from '../db/client'
import { Sealer } from '../lib/crypto'
import { currentMasterKey, stageDevelopmentKey } from '../signing/master-key'
import { type Resealed, resealAll } from '../signing/reseal'
import { OperatorError, Refused } from './args'
import { usesOperatorSocket } from './socket'

/**
 * `master-key rotate`: the new key only from the environment (a command line shows in `ps`), the
 * current one as a server would find it. Never through a running server, which keeps the old key in
 * memory: an embedded one holding DATA_DIR makes it refuse, and so do a PostgreSQL-backed server's
 * open connections (src/signing/reseal.ts).
 */
export async function rotateMasterKey(
  config: Readonly<Config>,
  env: Record<string, string | undefined>,
): Promise<{ rotated: Resealed; developmentKeyFile: string | null }> {
  const next = masterKeyFrom(env, 'NEW_MASTER_KEY')
  if (!next) {
    throw new OperatorError('NEW_MASTER_KEY is not set: put the new key there (64 hex characters or base64 of 32 bytes), not on the command line')
  }
  const current = currentMasterKey(config.masterKey, config.dataDir)
  if (!current) {
    throw new OperatorError('there is no master key to rotate from: MASTER_KEY is not set and DATA_DIR holds no development key')
  }
  if (current.key.equals(next)) throw new OperatorError('NEW_MASTER_KEY is the current master key')

  let release = () => {}
  if (usesOperatorSocket(config)) {
    // Another CLI lets go within seconds; a server never does.
    const lock = await lockDataDir(config.dataDir, 'cli', LOCK_WAIT_MS, async (holder) => holder.owner === 'cli')
    if (!isLock(lock)) throw new Refused(`${describeHolder(config.dataDir, lock)}: stop it before rotating the master key`)
    release = lock.release
  }
  try {
    const database = await openDb({ databaseUrl: config.databaseUrl, dataDir: config.dataDir, poolSize: 1 })
    // Written before the commit, put in place after it: the file and the data change together or not at all.
    const staged = current.file ? stageDevelopmentKey(current.file, next) : null
    let rotated: Resealed
    try {
      rotated = await resealAll(database, new Sealer(current.key), new Sealer(next))
    } catch (err) {
      staged?.discard()
      throw err
    } finally {
      await database.close()
    }
    if (staged) {
      try {
        staged.install()
      } catch {
        throw new Refused(
          `the values are re-sealed with NEW_MASTER_KEY, but ${current.file} could not be replaced (the new key is in ${staged.staged}): set MASTER_KEY to the new key`,
        )
      }
    }
    return { rotated, developmentKeyFile: current.file }
  } finally {
    release()
  }
}
