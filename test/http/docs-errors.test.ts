import { beforeAll, describe, expect, test } from 'bun:test'
import { randomUUID } from 'node:crypto'
import { EXAMPLE } from '../../src/lib/examples'
import { hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp, type TestApp } from '../support/helpers'

/**
 * Drives every operation through its common failures (no key, another account's or an absent resource,
 * a malformed, unknown-field, oversized or documented body) and checks each answer against the
 * document: its status must be declared, and its `error` one of the codes the route declares there.
 */

type Json = Record<string, any>
let t: TestApp
let doc: Json
/** The status and code of every answer, kept to show the drive reached the failures it claims to. */
const seen = new Set<string>()

beforeAll(async () => {
  t = await makeTestApp()
  doc = (await t.req('GET', '/docs/json')).body
})

// Refuses connections at once: a webhook there can be pinged without leaving the machine.
const LOCAL_HOOK = 'https://127.0.0.1:9/hook'

async function owned(credits = 1000) {
  const { apiKey, appId, appSecret } = await t.seed({ credits })
  const boundHwid = hwid()
  const licenseKey = await insertLicense(t.ctx, appId, { maxHwidSlots: 1, hwids: [boundHwid] })
  const hook = await t.req('POST', `/v1/apps/${appId}/webhooks`, { apiKey, body: { url: LOCAL_HOOK, events: ['license.created'] } })
  return { apiKey, appId, appSecret, licenseKey, boundHwid, webhookId: hook.body.webhookId as string }
}
type Owned = Awaited<ReturnType<typeof owned>>

async function check(where: string, op: Json, res: { status: number; body: any }) {
  const declared = op.responses[String(res.status)]
  expect(declared, `${where} answered ${res.status} ${JSON.stringify(res.body)}, which the document does not declare`).toBeDefined()
  if (res.status < 400) return seen.add(String(res.status))
  const codes = declared.content['application/json'].schema.properties.error.enum
  expect(codes, `${where} answered ${res.status} ${res.body.error}`).toContain(res.body.error)
  seen.add(`${res.status} ${res.body.error}`)
}

/** The operation's own body example, naming `own`'s resources instead of the example's. */
function exampleBody(op: Json, own: Owned): string | undefined {
  const example = op.requestBody?.content['application/json'].schema.examples?.[0]
  if (example === undefined) return undefined
  return JSON.stringify(example)
    .replaceAll(EXAMPLE.appId, own.appId)
    .replaceAll(EXAMPLE.licenseKey, own.licenseKey)
    .replaceAll(EXAMPLE.webhookId, own.webhookId)
    .replaceAll('https://example.com/hooks/licenses', LOCAL_HOOK)
}

describe('every Developer API answer is declared, with its code', () => {
  let foreign: Owned
  beforeAll(async () => {
    foreign = await owned()
  })

  const v1 = () =>
    Object.entries<Json>(doc.paths)
      .filter(([path]) => path.startsWith('/v1/'))
      .flatMap(([path, item]) => Object.entries<Json>(item).map(([method, op]) => ({ path, method: method.toUpperCase(), op })))

  test('for each operation, its common failures', async () => {
    for (const { path, method, op } of v1()) {
      const own = await owned()
      const broke = await owned(0)
      const values = (name: string, who: Owned): string[] =>
        ({
          appId: [who.appId, foreign.appId, randomUUID(), '%00'],
          licenseKey: [who.licenseKey, foreign.licenseKey, 'ZZZZ-ZZZZ-ZZZZ-ZZZZ', '%00'],
          webhookId: [who.webhookId, 'wh_absent', '%00'],
          hwid: [who.boundHwid, 'hwid-not-bound', '%00'],
        })[name] ?? []
      const names = [...path.matchAll(/\{(\w+)\}/g)].map((m) => m[1]!)
      const fill = (who: Owned, alter?: [string, string]) =>
        path.replace(/\{(\w+)\}/g, (_, name: string) => (alter?.[0] === name ? alter[1] : values(name, who)[0]!))
      // The account without credits calls on its own resources; the other variations on `own`'s.
      const calls: [Owned, string][] = [
        [broke, fill(broke)],
        [own, fill(own)],
        ...names.flatMap((n) => values(n, own).slice(1).map((v): [Owned, string] => [own, fill(own, [n, v])])),
      ]
      const queries = (who: Owned) =>
        path === '/v1/licenses' ? [`?appId=${who.appId}`, `?appId=${foreign.appId}`, `?appId=${who.appId}&limit=0`, `?appId=${who.appId}&cursor=x`] : ['']
      const bodies = (who: Owned) =>
        method === 'GET' ? [undefined] : [exampleBody(op, who), '{', '{"zz":1}', JSON.stringify('x'.repeat(1024 * 1024))]
      const where = `${method} ${path}`
      await check(where, op, await t.req(method, fill(own) + queries(own)[0]))
      for (const [who, url] of calls) {
        for (const q of queries(who)) {
          for (const body of bodies(who)) await check(where, op, await t.req(method, url + q, { apiKey: who.apiKey, body }))
        }
      }
    }
    for (const code of ['401 invalid_api_key', '400 bad_request', '413 bad_request', '403 forbidden', '404 not_found', '402 no_credits', '409 seats_full'])
      expect([...seen], code).toContain(code)
  })
})

describe('every client endpoint answer is declared, with its code', () => {
  test('validate, heartbeat and selfban through their failures', async () => {
    const ops = { validate: doc.paths['/auth/validate'].post, heartbeat: doc.paths['/auth/heartbeat'].post, selfban: doc.paths['/auth/selfban'].post }
    const call = async (name: keyof typeof ops, body: unknown) => {
      const res = await t.req('POST', `/auth/${name}`, { body })
      await check(`POST /auth/${name}`, ops[name], res)
      return res
    }
    const own = await owned()
    const { appId, appSecret, licenseKey } = own
    const device = hwid()
    const login = { appId, appSecret, licenseKey: await insertLicense(t.ctx, appId), hwid: device, nonce: nonce() }
    const ok = await call('validate', login)
    expect(ok.status).toBe(200)
    const sessionToken = JSON.parse(Buffer.from(ok.body.payload, 'base64').toString()).sessionToken
    const revoked = await insertLicense(t.ctx, appId, { status: 'revoked' })
    const expired = await insertLicense(t.ctx, appId, { expiresAt: new Date(Date.now() - 60_000) })
    for (const body of [
      login, // the nonce again
      { ...login, nonce: nonce(), appSecret: 'wrong' },
      { ...login, nonce: nonce(), appId: randomUUID() },
      { ...login, nonce: nonce(), licenseKey: 'ZZZZ-ZZZZ-ZZZZ-ZZZZ' },
      { ...login, nonce: nonce(), licenseKey },
      { ...login, nonce: nonce(), licenseKey: revoked },
      { ...login, nonce: nonce(), licenseKey: expired },
      { ...login, nonce: 'short' },
      '{',
      JSON.stringify({ ...login, hwid: 'x'.repeat(20_000) }),
    ])
      await call('validate', body)
    for (const body of [
      { appId, sessionToken, hwid: device },
      { appId, sessionToken: 'forged', hwid: device },
      { appId, sessionToken, hwid: hwid() },
      { appId: randomUUID(), sessionToken, hwid: device },
      { appId, hwid: device },
    ])
      await call('heartbeat', body)
    for (const body of [
      { appId, hwid: device, appSecret, licenseKey, nonce: nonce(), revokeLicense: true },
      { appId, hwid: device, appSecret, licenseKey: 'ZZZZ-ZZZZ-ZZZZ-ZZZZ', nonce: nonce(), revokeLicense: false },
      { appId, hwid: device, appSecret: 'wrong', licenseKey, nonce: nonce() },
      { appId, hwid: device, licenseKey },
      { appId, hwid: device, sessionToken: 'forged' },
    ])
      await call('selfban', body)
    await t.req('PUT', `/v1/apps/${appId}/security`, { apiKey: own.apiKey, body: { hwidBlacklist: [device] } })
    await call('validate', { ...login, nonce: nonce() })
    await call('heartbeat', { appId, sessionToken, hwid: device })
    await t.req('PATCH', `/v1/apps/${appId}`, { apiKey: own.apiKey, body: { disabled: true } })
    await call('validate', { ...login, nonce: nonce() })
    await call('selfban', { appId, hwid: device, sessionToken })
    for (const code of [
      '401 replay_detected',
      '401 invalid_app',
      '401 invalid_key',
      '401 session_expired',
      '403 hwid_mismatch',
      '403 blocked',
      '403 app_disabled',
      '403 revoke_requires_session',
      '410 revoked',
      '410 expired',
      '400 bad_request',
      '413 bad_request',
    ])
      expect([...seen], code).toContain(code)
  })
})
