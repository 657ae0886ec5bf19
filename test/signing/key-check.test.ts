/**
 * The database's master key check value: written at the first start (once what is sealed opens),
 * a start with another key refuses, and a process that missed a rotation seals nothing new.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { mkdtempSync } from 'node:fs'
import { randomBytes } from 'node:crypto'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { buildContext } from '../../src/boot'
import { loadConfig } from '../../src/config'
import { createApplication } from '../../src/apps/service'
import { type Database, openDb } from '../../src/db/client'
import { masterKeyCheck, signingKeys, webhooks } from '../../src/db/schema'
import { Sealer } from '../../src/lib/crypto'
import { KEY_MISMATCH, MasterKeyMismatch, storedKeyCheck, storeKeyCheck } from '../../src/signing/key-check'
import { makeTestApp, MODE, TEST_DATABASE_URL, TEST_MASTER_KEY } from '../support/helpers'
import { createOwnDatabase } from '../support/own-database'

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
  const database = await openDb({ databaseUrl, dataDir: null })
  cleanups.push(() => database.close())
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
})
