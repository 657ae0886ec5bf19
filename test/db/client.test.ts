import { describe, expect, spyOn, test } from 'bun:test'
import fs, { mkdtempSync, readlinkSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { sql } from 'drizzle-orm'
import { openDb, pgliteDir, poolSizePerProcess, REQUEST_POOL_SIZE } from '../../src/db/client'

describe('the request pool shared among server processes', () => {
  test('one process keeps the whole pool', () => {
    expect(poolSizePerProcess(1)).toBe(REQUEST_POOL_SIZE)
  })

  test('one per core: the server as a whole holds about the same, each process at least 4', () => {
    expect(poolSizePerProcess(2)).toBe(8)
    expect(poolSizePerProcess(3)).toBe(6)
    for (const n of [2, 3, 4]) expect(n * poolSizePerProcess(n)).toBeLessThan(REQUEST_POOL_SIZE + n)
    expect(poolSizePerProcess(8)).toBe(4)
    expect(poolSizePerProcess(64)).toBe(4)
  })
})

describe('the embedded database in a DATA_DIR', () => {
  test('a commit returns once its WAL is flushed to disk, so a crash of the machine cannot take it back', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ls-durable-'))
    const database = await openDb({ databaseUrl: null, dataDir: dir, poolSize: 1 })
    const fsync = spyOn(fs, 'fsyncSync')
    try {
      await database.db.execute(sql`CREATE TABLE durable_probe (x int)`)
      fsync.mockClear()
      await database.db.execute(sql`INSERT INTO durable_probe VALUES (1)`)
      const flushed = fsync.mock.calls.map(([fd]) => readlinkSync(`/proc/self/fd/${fd}`))
      expect(flushed.some((path) => path.startsWith(join(pgliteDir(dir), 'pg_wal')))).toBe(true)
    } finally {
      fsync.mockRestore()
      await database.close()
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
