import { describe, expect, test } from 'bun:test'
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { ConfigError } from '../../src/config'
import { startOperatorSocket } from '../../src/operator/socket'
import type { Context } from '../../src/context'
import { newDataDir } from '../support/data-dir'

const settings = (dataDir: string) => ({ dataDir, databaseUrl: null, redisUrl: null, masterKey: null }) as never

describe('operator socket', () => {
  test.each([
    ['directory', (path: string) => mkdirSync(join(path, 'nested'), { recursive: true }), (path: string) => existsSync(join(path, 'nested'))],
    ['file', (path: string) => writeFileSync(path, 'notes'), (path: string) => readFileSync(path, 'utf8') === 'notes'],
  ])('a %s where the socket goes is refused as a setting, and left as it was', async (kind, make, kept) => {
    const dataDir = await newDataDir('ls-socket-', { embedded: false })
    const path = join(dataDir, 'operator.sock')
    make(path)
    const never = new Promise<Context>(() => {})
    expect(() => startOperatorSocket(settings(dataDir), never)).toThrow(
      new ConfigError(`${path} is a ${kind}, not a socket: move it out of DATA_DIR`),
    )
    expect(kept(path)).toBe(true)
  })
})
