/**
 * The database's master key check value: written at the first start (once what is sealed opens),
 * a start with another key refuses, and a process that missed a rotation seals nothing new.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { mkdtempSync, rmSync } from 'node:fs'
import { randomBytes } from 'node:crypto'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { buildContext } from '../../src/boot'
import { loadConfig } from '../../src/config'
import { createApplication } from '../../src/apps/service'
import { type Database, openDb } from '../../src/db/client'
import { masterKeyCheck, signingKeys, webhooks } from '../../src/db/schema'
import { Sealer } from '../../src/lib/crypto'
import { KEY_MISMATCH, MasterKeyMismatch, storedKeyCheck, storeKeyCheck, watchKeyCheck } from '../../src/signing/key-check'
import { makeTestApp, MODE, TEST_DATABASE_URL, TEST_MASTER_KEY } from '../support/helpers'
import { createOwnDatabase } from '../support/own-database'
import { newDataDir } from '../support/data-dir'

const cleanups: (() => Promise<void>)[] = []
afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup()
})

/** A database no other test seals in: these tests change its check value. */
async function ownDatabase(): Promise<Database> {
  let databaseUrl: string | null = null
  if (TEST_DATABASE_URL) {
    const own = await createOwnDatabase('ls_keycheck')
    cleanups.push(own.drop)
    databaseUrl = own.url
  }
  // Embedded, a copy of the migrated template: a database made afresh (initdb) cost seconds a test.
  const dataDir = databaseUrl ? null : await newDataDir('ls-keycheck-', { embedded: true })
  const database = await openDb({ databaseUrl, dataDir })
  cleanups.push(async () => {
    await database.close()
    if (dataDir) rmSync(dataDir, { recursive: true, force: true })
  })
  return database
}

/** A start of the service on `database` with `masterKey`. */
const start = (database: Database, masterKey: Buffer) =>
  buildContext(loadConfig({ DATA_DIR: mkdtempSync(join(tmpdir(), 'ls-keycheck-')) }), {
    database,
    masterKey,
    embedded: true,
  })

describe(`master key check value (${MODE})`, () => {
  test('the first start writes it; a start with another key refuses with one line', async () => {
    const database = await ownDatabase()
    await makeTestApp({ database })
    expect(await storedKeyCheck(database.db)).toBe(new Sealer(TEST_MASTER_KEY).check)
    expect(await storedKeyCheck(database.db)).not.toContain(TEST_MASTER_KEY.toString('hex'))

    const refused = start(database, randomBytes(32))
    await expect(refused).rejects.toBeInstanceOf(MasterKeyMismatch)
    await expect(refused).rejects.toThrow(KEY_MISMATCH)
  })

  test('without one (an upgrade), it is written only by a key that opens what is sealed', async () => {
    const database = await ownDatabase()
    const { seed } = await makeTestApp({ database })
    const { keyId } = await seed()
    await database.db.delete(masterKeyCheck)

    await expect(start(database, randomBytes(32))).rejects.toThrow(
      `${KEY_MISMATCH}: 1 sealed value(s) do not open with it (signing key ${keyId})`,
    )
    expect(await storedKeyCheck(database.db)).toBeNull()

    await makeTestApp({ database })
    expect(await storedKeyCheck(database.db)).toBe(new Sealer(TEST_MASTER_KEY).check)
  })

  test('a server that missed a rotation seals nothing new: 500 internal_error, no row written', async () => {
    const database = await ownDatabase()
    const { ctx, req, seed } = await makeTestApp({ database })
    const { accountId, apiKey, appId } = await seed()
    // What a rotation commits while this server still holds the old key.
    await storeKeyCheck(database.db, new Sealer(randomBytes(32)).check)

    const hook = await req('POST', `/v1/apps/${appId}/webhooks`, { apiKey, body: { url: 'https://example.com/hook', events: ['license.created'] } })
    expect(hook.status, JSON.stringify(hook.body)).toBe(500)
    expect(hook.body.error).toBe('internal_error')
    const key = await req('POST', `/v1/apps/${appId}/signing-keys`, { apiKey })
    expect(key.status, JSON.stringify(key.body)).toBe(500)
    expect(key.body.error).toBe('internal_error')
    await expect(createApplication(ctx, accountId, 'After the rotation', false)).rejects.toThrow(KEY_MISMATCH)

    expect(await database.db.select().from(webhooks)).toEqual([])
    expect(await database.db.select({ id: signingKeys.id, active: signingKeys.active }).from(signingKeys)).toHaveLength(1)
    expect((await database.db.select({ active: signingKeys.active }).from(signingKeys))[0]?.active).toBe(true)
  })

  test('a server starting while a rotation holds the check row waits for its commit, then refuses the old key', async () => {
    const database = await ownDatabase()
    await makeTestApp({ database })
    const rotatedTo = new Sealer(randomBytes(32)).check
    let release = () => {}
    const held = new Promise<void>((resolve) => (release = resolve))
    let locked = () => {}
    const taken = new Promise<void>((resolve) => (locked = resolve))
    // The rotation's hold: the row FOR UPDATE from before its count of servers until its commit.
    const rotation = database.db.transaction(async (tx) => {
      await storedKeyCheck(tx, 'update')
      locked()
      await held
      await storeKeyCheck(tx, rotatedTo)
    })
    await taken
    const starting = start(database, TEST_MASTER_KEY)
    let settled = false
    void starting.then(() => (settled = true), () => (settled = true))
    await Bun.sleep(300)
    // Read without waiting, it found the old value and started on the old key.
    expect(settled).toBe(false)
    release()
    await rotation
    await expect(starting).rejects.toBeInstanceOf(MasterKeyMismatch)
  })

  test('a running server notices a rotation that committed while it ran', async () => {
    const database = await ownDatabase()
    await makeTestApp({ database })
    let rotated = 0
    const watch = watchKeyCheck(database, new Sealer(TEST_MASTER_KEY), () => void rotated++, 50)
    try {
      await Bun.sleep(200)
      expect(rotated).toBe(0)
      await storeKeyCheck(database.db, new Sealer(randomBytes(32)).check)
      const deadline = Date.now() + 5_000
      while (rotated === 0 && Date.now() < deadline) await Bun.sleep(20)
      await Bun.sleep(200)
      expect(rotated).toBe(1)
    } finally {
      watch.stop()
    }
  })
})
