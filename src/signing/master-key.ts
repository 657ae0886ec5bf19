import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { randomBytes } from 'node:crypto'
import { log } from '../lib/log'

/**
 * The key that seals signing keys and webhook secrets. Without MASTER_KEY a development key is
 * generated once into DATA_DIR, so the embedded default works with zero set-up; production sets it.
 */
export function resolveMasterKey(configured: Buffer | null, dataDir: string): Buffer {
  if (configured) return configured
  const path = join(dataDir, 'master.key')
  if (existsSync(path)) {
    const key = Buffer.from(readFileSync(path, 'utf8').trim(), 'hex')
    if (key.length !== 32) throw new Error(`${path} does not hold a 32-byte hex key`)
    log.warn('MASTER_KEY is not set: using the development key in DATA_DIR', { path })
    return key
  }
  mkdirSync(dataDir, { recursive: true })
  const key = randomBytes(32)
  writeFileSync(path, key.toString('hex'), { mode: 0o600, flag: 'wx' })
  chmodSync(path, 0o600)
  log.warn('MASTER_KEY is not set: generated a development key into DATA_DIR; set MASTER_KEY in production', { path })
  return key
}
