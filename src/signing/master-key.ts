import { closeSync, copyFileSync, existsSync, fsyncSync, openSync, readFileSync, renameSync, rmSync, writeSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { randomBytes } from 'node:crypto'
import { type Config, ConfigError } from '../config'
import { keyCheckValue } from '../lib/crypto'
import { log } from '../lib/log'
import { makeDataDir } from '../db/data-dir'

/**
 * The key that seals signing keys and webhook secrets. Without MASTER_KEY a development key is
 * generated once into DATA_DIR, so the embedded default works with zero set-up; production sets it.
 *
 * A rotation of the development key writes the new key to master.key.next before its transaction
 * commits and moves it to master.key after: until then the .next file is the only copy of the key
 * the database may already be sealed with, so it is written durably, never overwritten, and put in
 * place by whoever finds the database sealed with it (a start, or a rotation run again).
 */

export const developmentKeyPath = (dataDir: string) => join(dataDir, 'master.key')
export const pendingKeyPath = (path: string) => `${path}.next`
const previousKeyPath = (path: string) => `${path}.prev`

type KeySettings = Pick<Config, 'masterKey' | 'dataDir' | 'databaseUrl'>

function readKeyFile(path: string): Buffer | null {
  if (!existsSync(path)) return null
  const key = Buffer.from(readFileSync(path, 'utf8').trim(), 'hex')
  if (key.length !== 32) throw new ConfigError(`${path} does not hold a 32-byte hex key`)
  return key
}

/** Flushes a file, or a directory (a created or renamed entry survives a crash only once its directory is synced). */
function syncToDisk(path: string): void {
  const fd = openSync(path, 'r')
  try {
    fsyncSync(fd)
  } finally {
    closeSync(fd)
  }
}

/**
 * Writes a new key file (mode 0600 from its first byte; never over one) and makes it durable. A write
 * that fails (a full disk) removes the file it created: left empty, it would be read as a key file
 * that holds none, and every start would refuse.
 */
function writeKeyFile(path: string, key: Buffer): void {
  const fd = openSync(path, 'wx', 0o600)
  try {
    try {
      writeSync(fd, key.toString('hex'))
      fsyncSync(fd)
    } finally {
      closeSync(fd)
    }
  } catch (err) {
    rmSync(path, { force: true })
    throw err
  }
  syncToDisk(dirname(path))
}

/**
 * Puts a staged key in place of the development key, keeping the one it replaces as master.key.prev and
 * an earlier .prev as master.key.prev.1, .2…: a backup taken before any of the rotations opens only with
 * the key of its time.
 */
function installKey(path: string, staged: string): void {
  if (existsSync(path)) {
    const previous = previousKeyPath(path)
    if (existsSync(previous)) {
      let n = 1
      while (existsSync(`${previous}.${n}`)) n++
      renameSync(previous, `${previous}.${n}`)
    }
    copyFileSync(path, previous)
    syncToDisk(previous)
  }
  renameSync(staged, path)
  syncToDisk(dirname(path))
}

/**
 * Finishes a development-key rotation whose transaction committed but whose key was not put in place
 * (a crash, a full disk): when the database's check value is the staged key's. Returns that key.
 */
export function finishPendingRotation(path: string, stored: string | null): Buffer | null {
  const pending = readKeyFile(pendingKeyPath(path))
  if (!pending || stored !== keyCheckValue(pending)) return null
  installKey(path, pendingKeyPath(path))
  log.warn('finished an interrupted master-key rotation: the development key file now holds the new key', { path })
  return pending
}

/**
 * Refuses, before the database is opened, a development key file that holds no key (opened first, an
 * embedded database would be created in DATA_DIR for nothing), and a start that would have to generate
 * a development key beside a shared database: every instance would generate its own.
 */
export function requireKeySource(settings: KeySettings): void {
  if (settings.masterKey) return
  const path = developmentKeyPath(settings.dataDir)
  // Beside a staged key the database decides which file holds the key (finishPendingRotation).
  if (!existsSync(pendingKeyPath(path))) readKeyFile(path)
  if (!settings.databaseUrl) return
  if (existsSync(path) || existsSync(pendingKeyPath(path))) return
  throw new ConfigError('MASTER_KEY is not set: with DATABASE_URL every instance needs the same key; set MASTER_KEY')
}

/**
 * What the database says of its key: its check value (null when it has none yet) and whether anything
 * is sealed in it, which a version from before the check value may have done without writing one.
 */
export interface DatabaseSeal {
  check: string | null
  sealed: boolean
}

/** The key to start with. */
export function resolveMasterKey(settings: KeySettings, database: DatabaseSeal): Buffer {
  if (settings.masterKey) return settings.masterKey
  requireKeySource(settings)
  const path = developmentKeyPath(settings.dataDir)
  const finished = finishPendingRotation(path, database.check)
  if (finished) return finished
  const existing = readKeyFile(path)
  if (existsSync(pendingKeyPath(path))) {
    log.warn('a master key staged by a rotation that did not commit is left in DATA_DIR, unused', { path: pendingKeyPath(path) })
  }
  if (existing) {
    // A shared database is never sealed with a file of one host's DATA_DIR (an embedded run's, say): it
    // would need that file on every instance, and lose its secrets with it. One already sealed with it
    // (an earlier version allowed that) goes on, with the warning.
    if (settings.databaseUrl && !database.sealed) {
      throw new ConfigError(
        'MASTER_KEY is not set: with DATABASE_URL every instance needs the same key; set MASTER_KEY (the development key in DATA_DIR is used only for a database already sealed with it)',
      )
    }
    log.warn(
      settings.databaseUrl
        ? 'MASTER_KEY is not set: using the development key in DATA_DIR, which seals this shared database: every instance needs the file, and removing DATA_DIR loses it; set MASTER_KEY to its contents'
        : 'MASTER_KEY is not set: using the development key in DATA_DIR',
      { path },
    )
    return existing
  }
  // A staged key without the file it replaces: generating a third key would only add confusion.
  if (existsSync(pendingKeyPath(path))) {
    throw new ConfigError(`${path} is missing and ${pendingKeyPath(path)} does not match the database: set MASTER_KEY`)
  }
  // Sealed already, the database was sealed with MASTER_KEY (or a file since removed): a key generated
  // now opens none of it, and its file, left behind by the refused start, would pass for the database's.
  if (database.sealed) {
    throw new ConfigError(`MASTER_KEY is not set and ${path} does not exist, but this database's secrets are sealed with a key: set MASTER_KEY to it`)
  }
  makeDataDir(settings.dataDir)
  const key = randomBytes(32)
  writeKeyFile(path, key)
  log.warn('MASTER_KEY is not set: generated a development key into DATA_DIR; set MASTER_KEY in production', { path })
  return key
}

/**
 * The key a server started now would use, without generating one (a rotation has nothing to rotate
 * from then); `file` names the development key file when that is where it came from.
 */
export function currentMasterKey(configured: Buffer | null, dataDir: string): { key: Buffer; file: string | null } | null {
  if (configured) return { key: configured, file: null }
  const path = developmentKeyPath(dataDir)
  const key = readKeyFile(path)
  return key ? { key, file: path } : null
}

/**
 * A replacement development key, written beside the current one before a rotation commits and put
 * in its place after: a rename, so the file never holds half a key, and a rotation that failed
 * before its commit leaves the old file as it was. Refuses to replace a staged key it did not write.
 */
export function stageDevelopmentKey(path: string, key: Buffer): { staged: string; install(): void; discard(): void } {
  const staged = pendingKeyPath(path)
  writeKeyFile(staged, key)
  return {
    staged,
    install: () => installKey(path, staged),
    discard: () => rmSync(staged, { force: true }),
  }
}
