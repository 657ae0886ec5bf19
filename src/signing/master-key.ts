import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { randomBytes } from 'node:crypto'
import { log } from '../lib/log'

/**
 * The key that seals signing keys and webhook secrets. Without MASTER_KEY a development key is
 * generated once into DATA_DIR, so the embedded default works with zero set-up; production sets it.
 */

export const developmentKeyPath = (dataDir: string) => join(dataDir, 'master.key')

function readDevelopmentKey(path: string): Buffer | null {
  if (!existsSync(path)) return null
  const key = Buffer.from(readFileSync(path, 'utf8').trim(), 'hex')
  if (key.length !== 32) throw new Error(`${path} does not hold a 32-byte hex key`)
  return key
}

export function resolveMasterKey(configured: Buffer | null, dataDir: string): Buffer {
  if (configured) return configured
  const path = developmentKeyPath(dataDir)
  const existing = readDevelopmentKey(path)
  if (existing) {
    log.warn('MASTER_KEY is not set: using the development key in DATA_DIR', { path })
    return existing
  }
  mkdirSync(dataDir, { recursive: true })
  const key = randomBytes(32)
  writeFileSync(path, key.toString('hex'), { mode: 0o600, flag: 'wx' })
  chmodSync(path, 0o600)
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
  const key = readDevelopmentKey(path)
  return key ? { key, file: path } : null
}

/**
 * A replacement development key, written beside the current one before a rotation commits and put
 * in its place after: a rename, so the file never holds half a key, and a rotation that failed
 * leaves the old file as it was.
 */
export function stageDevelopmentKey(path: string, key: Buffer): { staged: string; install(): void; discard(): void } {
  const staged = `${path}.next`
  writeFileSync(staged, key.toString('hex'), { mode: 0o600 })
  chmodSync(staged, 0o600)
  return {
    staged,
    install: () => renameSync(staged, path),
    discard: () => rmSync(staged, { force: true }),
  }
}
