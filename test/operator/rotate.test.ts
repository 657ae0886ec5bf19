import { afterAll, describe, expect, setDefaultTimeout, test } from 'bun:test'
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { randomBytes } from 'node:crypto'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import postgres from 'postgres'
import { drizzle } from 'drizzle-orm/postgres-js'
import { eq } from 'drizzle-orm'
import { SERVER_CONNECTION_NAME } from '../../src/config'
import { type Db, openDb } from '../../src/db/client'
import * as schema from '../../src/db/schema'
import { Sealer } from '../../src/lib/crypto'
import { MODE, TEST_DATABASE_URL, TEST_REDIS_URL } from '../support/helpers'
import { KEY_MISMATCH } from '../../src/signing/key-check'
import { newDataDir } from '../support/data-dir'
import { createOwnDatabase } from '../support/own-database'
import { runToExit, type ServerProcess, startServer } from '../support/server-process'
import { signatureValid, startReceiver, testCertificate, until } from '../support/webhooks-receiver'
import { hwid, nonce, verifySigned } from '../support/client'

// Each test spawns servers and CLIs that open an embedded database or migrate a fresh one: a budget of its own.
setDefaultTimeout(180_000)

const cleanups: (() => Promise<void> | void)[] = []
afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup()
})

const hexKey = () => randomBytes(32).toString('hex')

/**
 * A rotation re-seals every row of its database and refuses while the service's connections are open
 * on it (this test process's shared pool is one): with PostgreSQL each test gets a database of its own.
 */
async function settings(masterKey: string): Promise<Record<string, string>> {
  const dataDir = await newDataDir('ls-rotate-', { embedded: !TEST_DATABASE_URL })
  cleanups.push(() => rmSync(dataDir, { recursive: true, force: true }))
  let databaseUrl = ''
  if (TEST_DATABASE_URL) {
    const own = await createOwnDatabase('ls_rotate')
    cleanups.push(own.drop)
    databaseUrl = own.url
  }
  return {
    DATA_DIR: dataDir,
    DATABASE_URL: databaseUrl,
    REDIS_URL: TEST_REDIS_URL ?? '',
    MASTER_KEY: masterKey,
    NODE_EXTRA_CA_CERTS: testCertificate().certFile,
    WEBHOOK_ALLOW_PRIVATE_TARGETS: 'true',
  }
}

/** Settings for a rotation refused before it opens the database: this run's shared one is safe. */
function unopened(masterKey: string): Record<string, string> {
  const dataDir = mkdtempSync(join(tmpdir(), 'ls-rotate-'))
  cleanups.push(() => rmSync(dataDir, { recursive: true, force: true }))
  return { DATA_DIR: dataDir, DATABASE_URL: TEST_DATABASE_URL ?? '', REDIS_URL: TEST_REDIS_URL ?? '', MASTER_KEY: masterKey }
}

/**
 * The development key file of an install that has one (with DATABASE_URL none is generated any more),
 * holding `key` when given.
 */
function developmentKey(env: Record<string, string>, key?: string): string {
  const path = join(env.DATA_DIR ?? '', 'master.key')
  if (key) writeFileSync(path, key, { mode: 0o600 })
  return path
}

/** The test's own look at the database while no server or CLI holds it; not under the service's connection name. */
async function withDb<T>(env: Record<string, string>, use: (db: Db) => Promise<T>): Promise<T> {
  if (env.DATABASE_URL) {
    const client = postgres(env.DATABASE_URL, { max: 1, onnotice: () => {} })
    try {
      return await use(drizzle({ client, schema }) as unknown as Db)
    } finally {
      await client.end()
    }
  }
  const database = await openDb({ databaseUrl: null, dataDir: env.DATA_DIR ?? null })
  try {
    return await use(database.db)
  } finally {
    await database.close()
  }
}

/** Every sealed value, by row. */
const sealedValues = (env: Record<string, string>) =>
  withDb(env, async (db) => ({
    keys: await db.select({ id: schema.signingKeys.id, sealed: schema.signingKeys.privateKeyEnc }).from(schema.signingKeys),
    hooks: await db.select({ id: schema.webhooks.id, sealed: schema.webhooks.secretEnc }).from(schema.webhooks),
  }))

/** A stopped server's backends leave pg_stat_activity a moment after its process exits. */
async function serverConnectionsGone(env: Record<string, string>) {
  if (!env.DATABASE_URL) return
  const sql = postgres(env.DATABASE_URL, { max: 1, onnotice: () => {} })
  try {
    await until(async () => {
      const [row] = await sql`SELECT count(*)::int AS n FROM pg_stat_activity
        WHERE datname = current_database() AND application_name = ${SERVER_CONNECTION_NAME}`
      return row?.n === 0
    }, 'the stopped server\'s connections to close')
  } finally {
    await sql.end()
  }
}

async function cli(env: Record<string, string>, args: string[]) {
  const run = await runToExit(['src/operator/cli.ts', ...args], env)
  const last = run.stdout.trimEnd().split('\n').at(-1) ?? ''
  let json: any
  try {
    json = JSON.parse(last)
  } catch {}
  return { ...run, json }
}

type CliRun = { code: number; stderr: string; json: any }

async function ok(run: CliRun | Promise<CliRun>) {
  const done = await run
  expect(done.code, done.stderr).toBe(0)
  return done.json
}

async function refused(run: Promise<{ code: number; stdout: string; stderr: string }>, mentions: RegExp) {
  const done = await run
  expect(done.code, done.stdout).toBe(1)
  expect(done.stdout).toBe('')
  expect(done.stderr.trimEnd().split('\n'), done.stderr).toEqual([expect.stringMatching(mentions)])
}

/** An account with one app and, where asked, the environment's master key sealing them. */
/**
 * `env` with MASTER_KEY set to the development key file's key: on PostgreSQL a fresh database is sealed
 * only with MASTER_KEY, never with the file, which is used after for a database already sealed with it.
 */
const sealedWith = (env: Record<string, string>, key: string) => ({ ...env, MASTER_KEY: key })

async function provision(env: Record<string, string>) {
  const account = await ok(cli(env, ['account', 'create', '--name', 'Rotation', '--credits', '100']))
  const app = await ok(cli(env, ['app', 'create', '--account', account.accountId, '--name', 'Rotated']))
  return { ...account, ...app } as { accountId: string; apiKey: string; appId: string; appSecret: string; publicKey: string; keyId: string }
}

type Provisioned = Awaited<ReturnType<typeof provision>>

async function call(server: ServerProcess, path: string, body: unknown, apiKey?: string) {
  const res = await fetch(`${server.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}) },
    body: JSON.stringify(body),
  })
  return { status: res.status, body: (await res.json()) as any }
}

const newLicense = async (server: ServerProcess, p: Provisioned) => {
  const created = await call(server, '/v1/licenses', { appId: p.appId, quantity: 1 }, p.apiKey)
  expect(created.status, JSON.stringify(created.body)).toBe(201)
  return created.body.licenses[0].licenseKey as string
}

/** The one machine the tests' licenses (one seat each) are used on. */
const machine = hwid()

const validate = (server: ServerProcess, p: Provisioned, licenseKey: string) =>
  call(server, '/auth/validate', { appId: p.appId, appSecret: p.appSecret, licenseKey, hwid: machine, nonce: nonce() })

/** A validate that passes, signed with the app's one public key under its one key id. */
async function expectSignedBy(server: ServerProcess, p: Provisioned, licenseKey: string) {
  const res = await validate(server, p, licenseKey)
  expect(res.status, JSON.stringify(res.body)).toBe(200)
  expect(verifySigned(res.body, p.publicKey)).toBe(true)
  expect(res.body.keyId).toBe(p.keyId)
}

describe(`master-key rotate (${MODE})`, () => {
  test('a server on the new key signs with the same public key and delivers with the same secret; on the old key it fails clearly', async () => {
    const oldKey = hexKey()
    const newKey = hexKey()
    const env = await settings(oldKey)
    const p = await provision(env)
    await using rx = startReceiver()

    let server = await startServer(env)
    let secret: string
    const licenseKey = await (async () => {
      try {
        const hook = await call(server, `/v1/apps/${p.appId}/webhooks`, { url: rx.url('/rotate'), events: ['license.created'] }, p.apiKey)
        expect(hook.status, JSON.stringify(hook.body)).toBe(201)
        secret = hook.body.secret
        const key = await newLicense(server, p)
        await expectSignedBy(server, p, key)
        // While a server holds the old key the rotation refuses, and changes nothing.
        await refused(
          cli({ ...env, NEW_MASTER_KEY: newKey }, ['master-key', 'rotate']),
          MODE === 'embedded' ? /a server answers on .*operator.sock: stop it before rotating/ : /connection\(s\) of a running server or CLI are open/,
        )
        await expectSignedBy(server, p, key)
        // Delivered by this server: stopped first, it would leave the event to the one on the new key.
        await until(() => rx.at('/rotate').length === 1, 'the first delivery')
        return key
      } finally {
        await server.stop()
      }
    })()

    await serverConnectionsGone(env)
    const before = await sealedValues(env)
    expect(await ok(cli({ ...env, NEW_MASTER_KEY: newKey }, ['master-key', 'rotate']))).toEqual({
      rotated: { signingKeys: 1, webhookSecrets: 1 },
      alreadyRotated: false,
      developmentKeyFile: null,
    })
    const after = await sealedValues(env)
    expect(after.keys.map((k) => k.id)).toEqual(before.keys.map((k) => k.id))
    expect(after.keys[0]?.sealed).not.toBe(before.keys[0]?.sealed)
    expect(after.hooks[0]?.sealed).not.toBe(before.hooks[0]?.sealed)

    server = await startServer({ ...env, MASTER_KEY: newKey })
    try {
      await expectSignedBy(server, p, licenseKey)
      await newLicense(server, p)
      await until(() => rx.at('/rotate').length === 2, 'a delivery by the server on the new key')
      for (const delivery of rx.at('/rotate')) expect(signatureValid(delivery, secret!)).toBe(true)
    } finally {
      await server.stop()
    }

    // On the old key a server refuses to start, with one line, rather than fail every signature.
    const stale = await runToExit(['src/main.ts'], { ...env, HOST: '127.0.0.1', PORT: '0' })
    expect(stale.code, stale.stderr).toBe(2)
    expect(stale.stderr).toBe(`configuration error: ${KEY_MISMATCH}\n`)
    expect(stale.stderr).not.toContain(oldKey)
  })

  test('a value that does not open stops the rotation with nothing changed; the development key file is replaced when it succeeds', async () => {
    const env = await settings('')
    const devKey = hexKey()
    const keyFile = developmentKey(env, devKey)
    const p = await provision(sealedWith(env, devKey))
    const second = await ok(cli(env, ['app', 'create', '--account', p.accountId, '--name', 'Sealed elsewhere']))
    const stranger = new Sealer(randomBytes(32))
    const original = await sealedValues(env)
    const secondSealed = original.keys.find((k) => k.id === second.keyId)?.sealed ?? ''
    const setSecond = (sealed: string) =>
      withDb(env, (db) => db.update(schema.signingKeys).set({ privateKeyEnc: sealed }).where(eq(schema.signingKeys.id, second.keyId)))
    await setSecond(stranger.seal(randomBytes(48)))
    const broken = await sealedValues(env)

    const newKey = hexKey()
    const run = await cli({ ...env, NEW_MASTER_KEY: newKey }, ['master-key', 'rotate'])
    expect(run.code, run.stdout).toBe(1)
    expect(run.stderr.trimEnd().split('\n')).toEqual([
      `error: 1 sealed value(s) do not open with the current master key (signing key ${second.keyId}); nothing was changed`,
    ])
    expect(await sealedValues(env)).toEqual(broken)
    expect(readFileSync(keyFile, 'utf8')).toBe(devKey)
    expect(existsSync(`${keyFile}.next`)).toBe(false)

    await setSecond(secondSealed)
    const rotation = await cli({ ...env, NEW_MASTER_KEY: Buffer.from(newKey, 'hex').toString('base64') }, ['master-key', 'rotate'])
    expect(await ok(rotation)).toEqual({
      rotated: { signingKeys: 2, webhookSecrets: 0 },
      alreadyRotated: false,
      developmentKeyFile: keyFile,
    })
    // A one-off command: the embedded database opened with few shared buffers (~290 MB with PGlite's 128).
    if (!TEST_DATABASE_URL) expect(rotation.peakRssMb).toBeLessThan(220)
    expect(readFileSync(keyFile, 'utf8')).toBe(newKey)
    expect(existsSync(`${keyFile}.next`)).toBe(false)
    // The same private keys, now under the new key.
    const fresh = new Sealer(Buffer.from(newKey, 'hex'))
    const old = new Sealer(Buffer.from(devKey, 'hex'))
    const rotated = await sealedValues(env)
    expect(rotated.keys.map((k) => fresh.open(k.sealed).toString('hex')).sort()).toEqual(
      original.keys.map((k) => old.open(k.sealed).toString('hex')).sort(),
    )
    expect(() => old.open(rotated.keys[0]?.sealed ?? '')).toThrow('does not open with this master key')
  })

  test('a rotation cut short after its commit is finished by rotate run again, or by the next start', async () => {
    const env = await settings('')
    const oldKey = hexKey()
    const keyFile = developmentKey(env, oldKey)
    await provision(sealedWith(env, oldKey))
    const newKey = hexKey()
    // The commit without the file: what a crash between the two leaves behind.
    expect(await ok(cli({ ...env, MASTER_KEY: oldKey, NEW_MASTER_KEY: newKey }, ['master-key', 'rotate']))).toMatchObject({
      alreadyRotated: false,
      developmentKeyFile: null,
    })
    writeFileSync(`${keyFile}.next`, newKey, { mode: 0o600 })
    expect(await ok(cli({ ...env, NEW_MASTER_KEY: newKey }, ['master-key', 'rotate']))).toEqual({
      rotated: { signingKeys: 0, webhookSecrets: 0 },
      alreadyRotated: true,
      developmentKeyFile: keyFile,
    })
    expect(readFileSync(keyFile, 'utf8')).toBe(newKey)
    expect(readFileSync(`${keyFile}.prev`, 'utf8')).toBe(oldKey)
    expect(existsSync(`${keyFile}.next`)).toBe(false)

    const thirdKey = hexKey()
    await ok(cli({ ...env, MASTER_KEY: newKey, NEW_MASTER_KEY: thirdKey }, ['master-key', 'rotate']))
    writeFileSync(`${keyFile}.next`, thirdKey, { mode: 0o600 })
    await ok(cli(env, ['account', 'list']))
    expect(readFileSync(keyFile, 'utf8')).toBe(thirdKey)
    expect(readFileSync(`${keyFile}.prev`, 'utf8')).toBe(newKey)
    // The key before it is kept too: a backup from before both rotations opens only with it.
    expect(readFileSync(`${keyFile}.prev.1`, 'utf8')).toBe(oldKey)
    expect(existsSync(`${keyFile}.next`)).toBe(false)
  })

  test('a staged key the database is not sealed with is never overwritten or removed', async () => {
    const env = await settings('')
    const devKey = hexKey()
    const keyFile = developmentKey(env, devKey)
    await provision(sealedWith(env, devKey))
    const stray = hexKey()
    writeFileSync(`${keyFile}.next`, stray, { mode: 0o600 })
    await refused(cli({ ...env, NEW_MASTER_KEY: hexKey() }, ['master-key', 'rotate']), /master\.key\.next is left by a rotation that did not commit/)
    await ok(cli(env, ['account', 'list']))
    expect(readFileSync(`${keyFile}.next`, 'utf8')).toBe(stray)
    expect(readFileSync(keyFile, 'utf8')).toBe(devKey)
  })

  test('a server answering on the operator socket stops the rotation, whatever holds the lock', async () => {
    const env = await settings(hexKey())
    // A server of another container on the same volume: its lock says nothing here, its socket answers.
    const server = Bun.serve({ unix: join(env.DATA_DIR ?? '', 'operator.sock'), fetch: () => Response.json({ error: 'not found' }, { status: 404 }) })
    try {
      await refused(cli({ ...env, NEW_MASTER_KEY: hexKey() }, ['master-key', 'rotate']), /^error: a server answers on .*operator\.sock: stop it/)
    } finally {
      server.stop(true)
    }
  })

  test('with DATABASE_URL and no MASTER_KEY the CLI and the server refuse, and generate no key', async () => {
    // Refused before the database is opened: an address nothing listens on shows it.
    const env: Record<string, string> = { ...unopened(''), DATABASE_URL: 'postgres://postgres@127.0.0.1:1/none' }
    const run = await cli(env, ['account', 'list'])
    expect(run.code, run.stdout).toBe(2)
    expect(run.stderr).toBe('error: MASTER_KEY is not set: with DATABASE_URL every instance needs the same key; set MASTER_KEY\n')
    const server = await runToExit(['src/main.ts'], { ...env, HOST: '127.0.0.1', PORT: '0' })
    expect(server.code, server.stderr).toBe(2)
    expect(server.stderr).toBe('configuration error: MASTER_KEY is not set: with DATABASE_URL every instance needs the same key; set MASTER_KEY\n')
    expect(existsSync(join(env.DATA_DIR ?? '', 'master.key'))).toBe(false)
  })

  test.skipIf(!TEST_DATABASE_URL)("a development key file in DATA_DIR seals no fresh shared database: the CLI and the server refuse; one sealed with it goes on", async () => {
    const env = await settings('')
    const devKey = hexKey()
    developmentKey(env, devKey)
    const refusal = 'MASTER_KEY is not set: with DATABASE_URL every instance needs the same key; set MASTER_KEY (the development key in DATA_DIR is used only for a database already sealed with it)'
    const run = await cli(env, ['account', 'list'])
    expect(run.code, run.stdout).toBe(2)
    expect(run.stderr).toBe(`error: ${refusal}\n`)
    const server = await runToExit(['src/main.ts'], { ...env, HOST: '127.0.0.1', PORT: '0' })
    expect(server.code, server.stderr).toBe(2)
    expect(server.stderr).toBe(`configuration error: ${refusal}\n`)
    // Sealed with that key through MASTER_KEY, the database is then opened with the file.
    await provision(sealedWith(env, devKey))
    await ok(cli(env, ['account', 'list']))
  })

  test.skipIf(!TEST_DATABASE_URL)('a shared database an earlier version sealed with the development key file, before the check value, goes on with it', async () => {
    const env = await settings('')
    const devKey = hexKey()
    const sealed = await provision(sealedWith(env, devKey))
    // What a version from before the key check value left: secrets sealed with the file, no check value.
    await withDb(env, (db) => db.delete(schema.masterKeyCheck))
    expect(await cli(env, ['account', 'list'])).toMatchObject({
      code: 2,
      stderr: 'error: MASTER_KEY is not set: with DATABASE_URL every instance needs the same key; set MASTER_KEY\n',
    })
    developmentKey(env, devKey)
    const server = await startServer({ ...env, HOST: '127.0.0.1' })
    try {
      expect(server.log()).toContain('using the development key in DATA_DIR, which seals this shared database')
      const created = await call(server, '/v1/licenses', { appId: sealed.appId }, sealed.apiKey)
      expect(created.status, JSON.stringify(created.body)).toBe(201)
      const validated = await call(server, '/auth/validate', {
        appId: sealed.appId,
        appSecret: sealed.appSecret,
        licenseKey: created.body.licenses[0].licenseKey,
        hwid: hwid(),
        nonce: nonce(),
      })
      expect(validated.status, JSON.stringify(validated.body)).toBe(200)
      expect(verifySigned(validated.body, sealed.publicKey)).toBe(true)
    } finally {
      expect(await server.stop()).toBe(0)
    }
    // The start wrote the file's check value: the database now says which key it is sealed with.
    expect(await withDb(env, (db) => db.select().from(schema.masterKeyCheck))).toHaveLength(1)
  })

  test.if(MODE === 'embedded')('without MASTER_KEY, a database sealed with one is refused, and no development key is generated beside it', async () => {
    const env = await settings(hexKey())
    await ok(cli(env, ['account', 'list']))
    const keyFile = join(env.DATA_DIR ?? '', 'master.key')
    const refusal = `MASTER_KEY is not set and ${keyFile} does not exist, but this database's secrets are sealed with a key: set MASTER_KEY to it`
    const unset = { ...env, MASTER_KEY: '' }
    const run = await cli(unset, ['account', 'list'])
    expect(run.code, run.stdout).toBe(2)
    expect(run.stderr).toBe(`error: ${refusal}\n`)
    const server = await runToExit(['src/main.ts'], { ...unset, PORT: '0' })
    expect(server.code, server.stdout).toBe(2)
    expect(server.stderr).toBe(`configuration error: ${refusal}\n`)
    // A key file left by the refusals would pass for the database's key (a rotation's, a backup's).
    expect(existsSync(keyFile)).toBe(false)
    await ok(cli(env, ['account', 'list']))
  })

  test('a development key file that holds no key is a settings problem, named as it is, before any database is opened', async () => {
    const env = unopened('')
    // Digits in the path: the CLI prints its own messages without the log's scrubbing.
    const dataDir = join(env.DATA_DIR ?? '', 'data-2026-11-24-0930')
    mkdirSync(dataDir)
    writeFileSync(join(dataDir, 'master.key'), 'not a key')
    const run = await cli({ ...env, DATA_DIR: dataDir }, ['account', 'list'])
    expect(run.code, run.stdout).toBe(2)
    expect(run.stderr).toBe(`error: ${join(dataDir, 'master.key')} does not hold a 32-byte hex key\n`)
    const server = await runToExit(['src/main.ts'], { ...env, DATA_DIR: dataDir, PORT: '0' })
    expect(server.code, server.stdout).toBe(2)
    expect(server.stderr).toBe(`configuration error: ${join(dataDir, 'master.key')} does not hold a 32-byte hex key\n`)
    // No embedded database was made in DATA_DIR (nor a shared one migrated) for a start refused anyway.
    expect(readdirSync(dataDir).filter((name) => name !== 'operator.sock')).toEqual(['master.key'])
  })

  test.each([
    [{ NEW_MASTER_KEY: '' }, /NEW_MASTER_KEY is not set/, 2],
    [{ NEW_MASTER_KEY: 'abc' }, /NEW_MASTER_KEY must be 32 bytes/, 2],
    [{ MASTER_KEY: '' }, /no master key to rotate from/, 2],
  ] as const)('%j is refused before anything is opened', async (extra, mentions, code) => {
    const env: Record<string, string> = { ...unopened(hexKey()), NEW_MASTER_KEY: hexKey(), ...extra }
    const run = await cli(env, ['master-key', 'rotate'])
    expect(run.code, run.stdout).toBe(code)
    expect(run.stderr.trimEnd().split('\n')).toEqual([expect.stringMatching(mentions)])
    expect(existsSync(join(env.DATA_DIR ?? '', 'master.key'))).toBe(false)
  })

  test.if(MODE === 'postgres')('a server that connects while the rotation runs makes it refuse at its commit', async () => {
    const env = await settings(hexKey())
    await provision(env)
    // Another session's lock holds the rotation after its first count of servers, at its table lock.
    const locker = postgres(env.DATABASE_URL!, { max: 2, onnotice: () => {} })
    const reconnected = postgres(env.DATABASE_URL!, { max: 1, onnotice: () => {}, connection: { application_name: SERVER_CONNECTION_NAME } })
    try {
      const rotation = await locker.reserve()
      await rotation`BEGIN`
      await rotation`LOCK TABLE webhooks IN ROW EXCLUSIVE MODE`
      const rotating = cli({ ...env, NEW_MASTER_KEY: hexKey() }, ['master-key', 'rotate'])
      await until(
        async () => (await locker`SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`)[0]!.n > 0,
        'the rotation waiting at its table lock',
      )
      // A server whose connections had dropped reconnects now (a restart of PostgreSQL behind it).
      await reconnected`SELECT 1`
      await rotation`COMMIT`
      rotation.release()
      await refused(rotating, /connection\(s\) of a running server or CLI are open/)
    } finally {
      await reconnected.end({ timeout: 1 })
      await locker.end({ timeout: 1 })
    }
  })

  test.if(MODE === 'postgres')('a server still running when a rotation commits stops, exit 2, as a start on the old key would', async () => {
    // A rotation counts the servers connected: one whose connections had all dropped then (a restart
    // of PostgreSQL) is missed, and kept serving on a key that opens nothing re-sealed.
    const env = await settings(hexKey())
    await provision(env)
    const server = await startServer(env)
    try {
      await withDb(env, (db) => db.update(schema.masterKeyCheck).set({ value: new Sealer(randomBytes(32)).check }))
      // The first process to notice stops the server, its other processes with it.
      await until(() => server.log().includes('the master key was rotated while this server ran'), 'the server noticing the rotation', 15_000)
    } finally {
      expect(await server.stop()).toBe(2)
    }
  })

  test('run again once the new key is in place (MASTER_KEY, or the development key file): nothing to do, alreadyRotated', async () => {
    const oldKey = hexKey()
    const newKey = hexKey()
    const env = await settings(oldKey)
    await provision(env)
    expect(await ok(cli({ ...env, NEW_MASTER_KEY: newKey }, ['master-key', 'rotate']))).toMatchObject({ alreadyRotated: false })
    expect(await ok(cli({ ...env, MASTER_KEY: newKey, NEW_MASTER_KEY: newKey }, ['master-key', 'rotate']))).toEqual({
      rotated: { signingKeys: 0, webhookSecrets: 0 },
      alreadyRotated: true,
      developmentKeyFile: null,
    })
    if (MODE !== 'embedded') {
      // With the servers already started again on the new key: nothing to re-seal, so nothing to refuse.
      const server = await startServer({ ...env, MASTER_KEY: newKey })
      try {
        expect(await ok(cli({ ...env, NEW_MASTER_KEY: newKey }, ['master-key', 'rotate']))).toMatchObject({ alreadyRotated: true })
      } finally {
        expect(await server.stop()).toBe(0)
      }
      return
    }
    // The development key: the first run replaced the file, which the second finds holding the new key.
    const devEnv = await settings('')
    const keyFile = developmentKey(devEnv, oldKey)
    await provision(sealedWith(devEnv, oldKey))
    await ok(cli({ ...devEnv, NEW_MASTER_KEY: newKey }, ['master-key', 'rotate']))
    expect(await ok(cli({ ...devEnv, NEW_MASTER_KEY: newKey }, ['master-key', 'rotate']))).toEqual({
      rotated: { signingKeys: 0, webhookSecrets: 0 },
      alreadyRotated: true,
      developmentKeyFile: keyFile,
    })
  })

  test('NEW_MASTER_KEY equal to the current key, the database not sealed with it, is refused', async () => {
    const key = hexKey()
    const env = { ...unopened(key), NEW_MASTER_KEY: key }
    const run = await cli(env, ['master-key', 'rotate'])
    expect(run.code).toBe(2)
    expect(run.stderr).toBe('error: NEW_MASTER_KEY is the current master key\n')
  })
})
