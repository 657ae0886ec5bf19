import { accessSync, chmodSync, constants, mkdirSync, statSync } from 'node:fs'
import { ConfigError } from '../config'
import { log } from '../lib/log'

/**
 * Creates DATA_DIR for this process's user alone (0700), as PostgreSQL insists of its data directory:
 * the embedded database under it holds license keys in the clear, HWIDs and the hashes of API keys and
 * app secrets, and PGlite writes its files readable by every local user (0644). An existing one that
 * others may enter is made 0700 when this user owns it; otherwise a warning says so.
 */
export function makeDataDir(dataDir: string): void {
  try {
    mkdirSync(dataDir, { recursive: true, mode: 0o700 })
  } catch (err) {
    // A file in the way, a parent this user cannot write: the setting, not the server, is wrong.
    throw new ConfigError(`DATA_DIR cannot be made a directory: "${dataDir}" (${(err as NodeJS.ErrnoException).code ?? 'failed'})`)
  }
  try {
    accessSync(dataDir, constants.W_OK | constants.X_OK)
  } catch (err) {
    // One that exists already: a volume mounted owned by another user (the image runs as `bun`).
    throw new ConfigError(`DATA_DIR is not writable by this user: "${dataDir}" (${(err as NodeJS.ErrnoException).code ?? 'failed'})`)
  }
  const uid = process.getuid?.()
  // No POSIX owner and modes to go by (Windows).
  if (uid === undefined) return
  const { mode, uid: owner } = statSync(dataDir)
  if ((mode & 0o077) === 0) return
  if (owner === uid) {
    chmodSync(dataDir, 0o700)
    log.warn('DATA_DIR was open to other local users: made it 0700', { path: dataDir, was: (mode & 0o777).toString(8) })
  } else {
    log.warn("DATA_DIR is open to other local users and belongs to another user: make it 0700 (the embedded database's files are readable by all)", {
      path: dataDir,
    })
  }
}
