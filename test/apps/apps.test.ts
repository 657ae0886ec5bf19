import { beforeAll, describe, expect, test } from 'bun:test'
import { eq, sql } from 'drizzle-orm'
import { createApiKey, revokeApiKey } from '../../src/accounts/service'
import { randomUUID } from 'node:crypto'
import { apps, signingKeys } from '../../src/db/schema'
import { ROWS_PER_READ } from '../../src/http/streamed-list'
import { makeTestApp, type TestApp } from '../support/helpers'
import { appEpochKey } from '../support/client'

const errorBody = (error: string) => ({ error, message: expect.any(String) })
const ISO_MS = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

let t: TestApp
beforeAll(async () => {
  t = await makeTestApp()
})

type Seeded = Awaited<ReturnType<TestApp['seed']>>

describe('POST /v1/apps', () => {
  test('creates an app and shows its secret once', async () => {
    const s = await t.seed()
    const res = await t.req('POST', '/v1/apps', {
      apiKey: s.apiKey,
      body: { name: 'Desktop client' },
    })
    expect(res.status).toBe(201)
    expect(res.body).toEqual({
      appId: expect.stringMatching(UUID),
      name: 'Desktop client',
      sandbox: false,
      appSecret: expect.any(String),
      publicKey: expect.any(String),
      keyId: expect.any(String),
      createdAt: expect.stringMatching(ISO_MS),
    })
    // At least 128 bits of secret; a raw 32-byte Ed25519 key.
    expect(Buffer.from(res.body.appSecret, 'base64url').length).toBeGreaterThanOrEqual(16)
    expect(Buffer.from(res.body.publicKey, 'base64')).toHaveLength(32)

    const list = await t.req('GET', '/v1/apps', { apiKey: s.apiKey })
    const listed = list.body.apps.find((a: any) => a.appId === res.body.appId)
    expect(listed).toEqual({
      appId: res.body.appId,
      name: 'Desktop client',
      sandbox: false,
      disabled: false,
      createdAt: res.body.createdAt,
    })
    expect(JSON.stringify(list.body)).not.toContain(res.body.appSecret)

    const licenses = await t.req('POST', '/v1/licenses', {
      apiKey: s.apiKey,
      body: { appId: res.body.appId },
    })
    expect(licenses.status).toBe(201)
  })

  test('sandbox apps and 128-character names are accepted, an emoji one character', async () => {
    const s = await t.seed()
    for (const name of ['n'.repeat(128), '\u{1F600}'.repeat(128)]) {
      const res = await t.req('POST', '/v1/apps', { apiKey: s.apiKey, body: { name, sandbox: true } })
      expect(res.status).toBe(201)
      expect(res.body).toMatchObject({ name, sandbox: true })
    }
  })

  describe.each([
    ['missing name', {}],
    ['empty name', { name: '' }],
    ['name of 129 characters', { name: 'n'.repeat(129) }],
    ['name of 129 emoji', { name: '\u{1F600}'.repeat(129) }],
    ['name not a string', { name: 7 }],
    ['sandbox not a boolean', { name: 'x', sandbox: 'yes' }],
  ])('400 bad_request: %s', (_name, body) => {
    test('creates no app', async () => {
      const s = await t.seed()
      const res = await t.req('POST', '/v1/apps', { apiKey: s.apiKey, body })
      expect(res.status, JSON.stringify(res.body)).toBe(400)
      expect(res.body).toEqual(errorBody('bad_request'))
      expect((await t.req('GET', '/v1/apps', { apiKey: s.apiKey })).body.apps).toHaveLength(1)
    })
  })
})

describe('GET /v1/apps', () => {
  test("lists only the account's apps, newest first, without secrets", async () => {
    const s = await t.seed()
    await t.seed()
    // Apps made in the same millisecond would tie: date the first one back.
    await t.ctx.database.db
      .update(apps)
      .set({ createdAt: new Date('2020-01-01T00:00:00Z') })
      .where(eq(apps.id, s.appId))
    const second = await t.req('POST', '/v1/apps', { apiKey: s.apiKey, body: { name: 'Second' } })
    const res = await t.req('GET', '/v1/apps', { apiKey: s.apiKey })
    expect(res.status).toBe(200)
    expect(res.body.apps.map((a: any) => a.appId)).toEqual([second.body.appId, s.appId])
    for (const app of res.body.apps)
      expect(Object.keys(app).sort()).toEqual(['appId', 'createdAt', 'disabled', 'name', 'sandbox'])
  })
})

/** How many pieces a listing's response body arrives in: one per read, never all rows at once. */
async function piecesOf(path: string, apiKey: string): Promise<number> {
  const streamed = await t.app.handle(new Request(`http://localhost${path}`, { headers: { authorization: `Bearer ${apiKey}` } }))
  let pieces = 0
  for await (const _ of streamed.body!) pieces++
  return pieces
}

/** Two reads and a half of rows; many share a millisecond, across the reads' bounds too. */
const MANY = ROWS_PER_READ * 2 + ROWS_PER_READ / 2

describe('listings with more rows than one read takes', () => {
  test('GET /v1/apps: every app, once, newest first, ties in time by id, read a piece at a time', async () => {
    const s = await t.seed()
    const [own] = await t.ctx.database.db.select().from(apps).where(eq(apps.id, s.appId))
    const rows = Array.from({ length: MANY }, (_, i) => ({
      id: randomUUID(),
      accountId: s.accountId,
      name: `App ${i}`,
      secretHash: own!.secretHash,
      // Older than the seeded app (and than anything else a listing of every account shows first).
      createdAt: new Date(Date.UTC(2020, 0, 1) + Math.floor(i / 7)),
    }))
    for (let i = 0; i < rows.length; i += 500) await t.ctx.database.db.insert(apps).values(rows.slice(i, i + 500))
    const res = await t.req('GET', '/v1/apps', { apiKey: s.apiKey })
    expect(res.status).toBe(200)
    const newestFirst = rows.toSorted((a, b) => b.createdAt.getTime() - a.createdAt.getTime() || (a.id < b.id ? 1 : -1))
    expect(res.body.apps.map((a: { appId: string }) => a.appId)).toEqual([s.appId, ...newestFirst.map((r) => r.id)])
    expect(res.body.apps[1]).toEqual({ appId: newestFirst[0]!.id, name: newestFirst[0]!.name, sandbox: false, disabled: false, createdAt: newestFirst[0]!.createdAt.toISOString() })
    expect(res.headers.get('content-type')).toStartWith('application/json')
    expect(res.headers.get('ratelimit-limit')).toEqual(expect.any(String))
    expect(await piecesOf('/v1/apps', s.apiKey)).toBe(3)
  })

  test('GET /v1/apps/:appId/signing-keys: every key, once, newest first, read a piece at a time', async () => {
    const s = await t.seed()
    const [first] = await t.ctx.database.db.select().from(signingKeys).where(eq(signingKeys.appId, s.appId))
    const rows = Array.from({ length: MANY }, (_, i) => ({ ...first!, id: `k${i}-${randomUUID()}`, version: first!.version + 1 + i, active: false }))
    for (let i = 0; i < rows.length; i += 500) await t.ctx.database.db.insert(signingKeys).values(rows.slice(i, i + 500))
    const path = `/v1/apps/${s.appId}/signing-keys`
    const res = await t.req('GET', path, { apiKey: s.apiKey })
    expect(res.status).toBe(200)
    expect(res.body.keys.map((k: { keyId: string }) => k.keyId)).toEqual([...rows.map((r) => r.id).reverse(), first!.id])
    expect(res.body.keys.at(-1)).toEqual({ keyId: first!.id, publicKey: first!.publicKey, active: true, createdAt: first!.createdAt.toISOString() })
    expect(await piecesOf(path, s.apiKey)).toBe(3)
  })
})

describe('/v1/apps/:appId/signing-keys', () => {
  test('lists the first key, rotates to a new active key and keeps the old one listed inactive', async () => {
    const s = await t.seed()
    const first = await t.req('GET', `/v1/apps/${s.appId}/signing-keys`, { apiKey: s.apiKey })
    expect(first.status).toBe(200)
    expect(first.body).toEqual({
      keys: [
        {
          keyId: s.keyId,
          publicKey: s.publicKey,
          active: true,
          createdAt: expect.stringMatching(ISO_MS),
        },
      ],
    })

    const [epochBefore] = await t.ctx.store.epochs([await appEpochKey(t.ctx, s.appId)])
    const rotated = await t.req('POST', `/v1/apps/${s.appId}/signing-keys`, { apiKey: s.apiKey })
    expect(rotated.status).toBe(201)
    expect(rotated.body).toEqual({ keyId: expect.any(String), publicKey: expect.any(String) })
    expect(rotated.body.keyId).not.toBe(s.keyId)
    expect(Buffer.from(rotated.body.publicKey, 'base64')).toHaveLength(32)
    const [epochAfter] = await t.ctx.store.epochs([await appEpochKey(t.ctx, s.appId)])
    expect(epochAfter ?? 0).toBeGreaterThan(epochBefore ?? 0)

    const after = await t.req('GET', `/v1/apps/${s.appId}/signing-keys`, { apiKey: s.apiKey })
    expect(after.body.keys.map((k: any) => [k.keyId, k.active])).toEqual([
      [rotated.body.keyId, true],
      [s.keyId, false],
    ])
  })

  test("a rotation's key is dated when it takes over, after a rotation holding the app ahead of it", async () => {
    const s = await t.seed()
    let released = 0
    // Another instance's rotation, as far as this one can tell: the app's row held a while.
    const holding = t.ctx.database.db.transaction(async (tx) => {
      await tx.execute(sql`SELECT id FROM apps WHERE id = ${s.appId} FOR UPDATE`)
      await Bun.sleep(300)
      released = Date.now()
    })
    await Bun.sleep(20)
    const rotated = await t.req('POST', `/v1/apps/${s.appId}/signing-keys`, { apiKey: s.apiKey })
    await holding
    expect(rotated.status).toBe(201)
    const listed = await t.req('GET', `/v1/apps/${s.appId}/signing-keys`, { apiKey: s.apiKey })
    const [newest, retired] = listed.body.keys
    expect(newest.keyId).toBe(rotated.body.keyId)
    // Milliseconds as stored: the release's own clock read may fall a millisecond after the commit.
    expect(Date.parse(newest.createdAt)).toBeGreaterThanOrEqual(released - 1)
    expect(Date.parse(newest.createdAt)).toBeGreaterThan(Date.parse(retired.createdAt))
  })

  test('a rotation rewrites only the key it retires, not every earlier one', async () => {
    const s = await t.seed()
    const rotate = async () => expect((await t.req('POST', `/v1/apps/${s.appId}/signing-keys`, { apiKey: s.apiKey })).status).toBe(201)
    // The row version PostgreSQL stamps on a row each time it is written.
    const written = (keyId: string) =>
      t.ctx.database.aside(async (ask) => (await ask('SELECT xmin::text AS xmin FROM signing_keys WHERE id = $1', [keyId]))[0]?.xmin)
    await rotate()
    const retired = await written(s.keyId)
    expect(retired).toBeString()
    await rotate()
    expect(await written(s.keyId)).toBe(retired)
  })

  test.each([
    ["another account's app", (other: Seeded) => other.appId],
    ['an absent app', () => '00000000-0000-4000-8000-000000000000'],
    ['an appId that is not a UUID', () => 'x'],
  ])('403 forbidden for %s', async (_name, appIdOf) => {
    const s = await t.seed()
    const other = await t.seed()
    const appId = appIdOf(other)
    for (const method of ['GET', 'POST'] as const) {
      const res = await t.req(method, `/v1/apps/${appId}/signing-keys`, { apiKey: s.apiKey })
      expect(res.status, method).toBe(403)
      expect(res.body).toEqual(errorBody('forbidden'))
    }
    const theirs = await t.req('GET', `/v1/apps/${other.appId}/signing-keys`, {
      apiKey: other.apiKey,
    })
    expect(theirs.body.keys).toHaveLength(1)
  })
})

test.each([
  ['no key', async () => undefined],
  ['a malformed key', async () => 'Basic abc'],
  ['an unknown key', async () => 'svc_live_CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC'],
  [
    'a revoked key',
    async (s: Seeded) => {
      const apiKey = await createApiKey(t.ctx, s.accountId)
      await revokeApiKey(t.ctx, apiKey)
      return apiKey
    },
  ],
])('401 invalid_api_key with %s on every account and app route', async (_name, keyOf) => {
  const s = await t.seed()
  const apiKey = await keyOf(s)
  for (const [method, path, body] of [
    ['GET', '/v1/account', undefined],
    ['POST', '/v1/apps', { name: 'x' }],
    ['GET', '/v1/apps', undefined],
    ['GET', `/v1/apps/${s.appId}/signing-keys`, undefined],
    ['POST', `/v1/apps/${s.appId}/signing-keys`, undefined],
  ] as const) {
    const res = await t.req(method, path, { apiKey, body })
    expect(res.status, `${method} ${path}`).toBe(401)
    expect(res.body).toEqual(errorBody('invalid_api_key'))
  }
  const listed = await t.req('GET', '/v1/apps', { apiKey: s.apiKey })
  expect(listed.body.apps).toHaveLength(1)
  const signing = await t.req('GET', `/v1/apps/${s.appId}/signing-keys`, { apiKey: s.apiKey })
  expect(signing.body.keys).toHaveLength(1)
})
