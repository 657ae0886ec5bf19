import { beforeAll, describe, expect, test } from 'bun:test'
import { createHash } from 'node:crypto'
import { and, eq } from 'drizzle-orm'
import { events, licenses, offlineFiles } from '../../src/db/schema'
import { parseActivationRequest } from '../../src/licenses/offline/request'
import { makeTestApp, type TestApp } from '../support/helpers'
import { EXAMPLE } from '../../src/lib/examples'
import { insertLicense } from '../support/client'
import { verifyLicenseFile } from '../support/license-verifier'
// AuthForge's cross-SDK conformance vectors, copied unchanged from AuthForgeCC/authforge-rust,
// activation_request_vectors.json at commit 8b3415769183a06a31efc04f465dc0bd0b9bb05f.
import vectors from '../fixtures/activation_request_vectors.json'

const errorBody = (error: string) => ({ error, message: expect.any(String) })

describe("the parser against AuthForge's activation_request_vectors.json", () => {
  const good = vectors.cases.filter((c) => c.expect === 'ok')
  const bad = vectors.cases.filter((c) => c.expect !== 'ok')

  test.each(good.map((c) => [c.name, c] as const))('%s is accepted', (_, c) => {
    const inputs = 'inputs' in c && c.inputs ? c.inputs : { hwid: 'testhwid', licenseKey: undefined }
    expect(parseActivationRequest(c.file, 'test-app')).toEqual({ hwid: inputs.hwid, licenseKey: inputs.licenseKey ?? null, licenseKeyRefusal: null, appId: 'test-app' })
  })

  const reasons: Record<string, RegExp> = {
    checksum_mismatch: /bad checksum/,
    // Cut in the payload: its checksum no longer matches.
    reject: /bad checksum|truncated/,
    is_license_file: /license file/,
  }
  test.each(bad.map((c) => [c.name, c] as const))('%s is refused with its reason', (_, c) => {
    expect(() => parseActivationRequest(c.file, 'test-app')).toThrow(reasons[c.expect]!)
  })

  test("the OpenAPI document's example request is one the server takes, for the example's machine and license", async () => {
    const t = await makeTestApp()
    const doc = (await t.req('GET', '/docs/json')).body
    const body = doc.paths['/v1/apps/{appId}/activation-requests'].post.requestBody.content
    const texts = [body['text/plain'].schema.examples[0], body['application/json'].schema.examples[0].request]
    for (const text of texts) {
      expect(parseActivationRequest(text, EXAMPLE.appId)).toEqual({ hwid: EXAMPLE.hwid, licenseKey: EXAMPLE.licenseKey, licenseKeyRefusal: null, appId: EXAMPLE.appId })
    }
  })

  test("another app's request is refused, whether the header or the payload says so", () => {
    const file = good[0]!.file
    expect(() => parseActivationRequest(file, 'other-app')).toThrow(/another app/)
    expect(() => parseActivationRequest(file.replace('App-Id: test-app', 'App-Id: other-app'), 'other-app')).toThrow(/another app/)
  })
})

// ---- A request built here from the format, as an SDK writes it.

const wrap64 = (base64: string) => base64.replace(/.{64}(?=.)/g, '$&\n')

/** `fields` as JSON, or JSON text as it is (one no JSON.stringify could write), or the payload's bytes. */
function buildRequest(fields: Record<string, unknown> | string | Buffer, opts: { version?: string; checksum?: string; appIdHeader?: string } = {}) {
  const bytes = Buffer.isBuffer(fields) ? fields : Buffer.from(typeof fields === 'string' ? fields : JSON.stringify(fields), 'utf8')
  const payload = bytes.toString('base64')
  const checksum = opts.checksum ?? createHash('sha256').update(payload).digest('hex').slice(0, 16)
  return [
    '-----BEGIN AUTHFORGE ACTIVATION REQUEST-----',
    `Version: ${opts.version ?? '1'}`,
    `App-Id: ${opts.appIdHeader ?? (typeof fields === 'string' || Buffer.isBuffer(fields) ? '' : fields.appId)}`,
    `Checksum: ${checksum}`,
    '',
    wrap64(payload),
    '-----END AUTHFORGE ACTIVATION REQUEST-----',
    '',
  ].join('\n')
}

const requestFields = (appId: string, hwid: string, licenseKey?: string) => ({
  v: 1,
  typ: 'authforge-activation-request',
  appId,
  hwid,
  createdAt: new Date().toISOString(),
  machineName: 'lab-pc',
  os: 'Windows 11',
  sdk: 'rust/1.4.0',
  ...(licenseKey ? { licenseKey } : {}),
})

/** What e-mail does to a request: a BOM, CRLF, lines re-wrapped at 20 columns, text around it. */
const emailed = (request: string) =>
  `\uFEFFHello, here is the request:\r\n\r\n${request
    .replace(/^([A-Za-z0-9+/=]{21,})$/gm, (line) => line.replace(/.{20}(?=.)/g, '$&\n'))
    .replace(/\n/g, '\r\n')}\r\nRegards,\r\nPat\r\n`

let t: TestApp

beforeAll(async () => {
  t = await makeTestApp()
})

type Seeded = Awaited<ReturnType<TestApp['seed']>>

const path = (appId: string) => `/v1/apps/${appId}/activation-requests`
const post = (s: Seeded, body: unknown, opts: { appId?: string; headers?: Record<string, string> } = {}) =>
  t.req('POST', path(opts.appId ?? s.appId), {
    apiKey: s.apiKey,
    body,
    headers: typeof body === 'string' ? { 'content-type': 'text/plain; charset=utf-8', ...opts.headers } : opts.headers,
  })

const row = async (licenseKey: string) => (await t.ctx.database.db.select().from(licenses).where(eq(licenses.key, licenseKey)))[0]!
const fileRows = (licenseKey: string) => t.ctx.database.db.select().from(offlineFiles).where(eq(offlineFiles.licenseKey, licenseKey))
const balance = (s: Seeded) => t.ctx.credits.currentBalance(s.accountId)
const check = (s: Seeded, file: string, machine: string) =>
  verifyLicenseFile(file, { appId: s.appId, publicKeys: [s.publicKey], hwid: machine, nowMs: Date.now() })

describe('POST /v1/apps/:appId/activation-requests', () => {
  test('an e-mailed text/plain request mints a file bound to its HWID that verifies, taking a seat and a credit', async () => {
    const s = await t.seed({ credits: 5 })
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 2 })
    const machine = 'air-gapped-' + 'x'.repeat(100)
    const res = await post(s, emailed(buildRequest(requestFields(s.appId, machine, licenseKey))))
    expect(res.status, JSON.stringify(res.body)).toBe(201)
    expect(res.body).toEqual({
      fileId: expect.stringMatching(/^[0-9a-f-]{36}$/),
      licenseKey,
      appId: s.appId,
      keyId: s.keyId,
      issuedAt: expect.any(String),
      expiresAt: null,
      hwid: { mode: 'bound', hwids: [machine] },
      file: expect.any(String),
    })
    expect(check(s, res.body.file, machine).code).toBe('ok')
    expect(check(s, res.body.file, 'another-machine').code).toBe('hwid_mismatch')
    expect((await row(licenseKey)).hwids).toEqual([machine])
    expect(await fileRows(licenseKey)).toHaveLength(1)
    expect(await balance(s)).toBe(4)
    const issued = await t.ctx.database.db
      .select()
      .from(events)
      .where(and(eq(events.event, 'license.offline_issued'), eq(events.appId, s.appId)))
    expect(issued.map((e) => (e.data as { fileId: string }).fileId)).toEqual([res.body.fileId])
  })

  test("a machine name that is not UTF-8 (the C++ SDK clips one mid-character, or writes a Windows code page's) is no reason to refuse", async () => {
    const s = await t.seed({ credits: 5 })
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 1 })
    const [before, after] = JSON.stringify({ ...requestFields(s.appId, 'm-cpp', licenseKey), machineName: '#' }).split('#')
    // "研" cut after two of its three bytes, then cp1252's Ü.
    const payload = Buffer.concat([Buffer.from(before!), Buffer.from([0xe7, 0xa0, 0xdc]), Buffer.from(after!)])
    const res = await post(s, buildRequest(payload, { appIdHeader: s.appId }))
    expect(res.status, JSON.stringify(res.body)).toBe(201)
    expect(check(s, res.body.file, 'm-cpp').code).toBe('ok')
  })

  test('JSON body: the license and expiry from the body; an already bound HWID takes no new seat', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 1, hwids: ['m1'] })
    const expiresAt = new Date(Date.now() + 7 * 86_400_000).toISOString()
    const res = await post(s, { request: buildRequest(requestFields(s.appId, 'm1')), licenseKey, expiresAt })
    expect(res.status, JSON.stringify(res.body)).toBe(201)
    expect(res.body.expiresAt).toBe(expiresAt)
    expect(check(s, res.body.file, 'm1').code).toBe('ok')
    expect((await row(licenseKey)).hwids).toEqual(['m1'])
  })

  test("the body's licenseKey wins over the request's, which the customer writes (its checksum is no signature)", async () => {
    const s = await t.seed()
    const chosen = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 1 })
    const other = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 1 })
    const res = await post(s, { request: buildRequest(requestFields(s.appId, 'm-chosen', other)), licenseKey: chosen })
    expect(res.status, JSON.stringify(res.body)).toBe(201)
    expect(res.body.licenseKey).toBe(chosen)
    expect((await row(chosen)).hwids).toEqual(['m-chosen'])
    expect((await row(other)).hwids).toEqual([])
    // A stale or mistyped key in the request does not stand in the way of the one the caller names.
    const stale = await post(s, { request: buildRequest(requestFields(s.appId, 'm-chosen', 'ABCD-EFGH-JKLM-NPQR')), licenseKey: chosen })
    expect(stale.status, JSON.stringify(stale.body)).toBe(201)
    expect(stale.body.licenseKey).toBe(chosen)
  })

  test('an HWID that begins or ends with white space: 400, nothing bound, charged or minted (no SDK would ever match it)', async () => {
    const s = await t.seed({ credits: 5 })
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 2 })
    for (const machine of [' m1', 'm1 ', '   ', 'm1\t', 'm1\u0085']) {
      const res = await post(s, buildRequest(requestFields(s.appId, machine, licenseKey)))
      expect(res.status, JSON.stringify(res.body)).toBe(400)
      expect(res.body.message).toStartWith('Activation request refused: its HWID begins or ends with white space')
    }
    expect((await row(licenseKey)).hwids).toEqual([])
    expect(await fileRows(licenseKey)).toHaveLength(0)
    expect(await balance(s)).toBe(5)
  })

  test('with Accept: application/x-authforge-license the body is the file, as an attachment', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId)
    const res = await post(s, buildRequest(requestFields(s.appId, 'm1', licenseKey)), {
      headers: { accept: 'application/x-authforge-license' },
    })
    expect(res.status).toBe(201)
    expect(res.headers.get('content-type')).toStartWith('application/x-authforge-license')
    expect(res.headers.get('content-disposition')).toBe(`attachment; filename="${licenseKey}.authforge"`)
    expect(check(s, res.body, 'm1').code).toBe('ok')
  })

  test('no free seat: 409 seats_full, nothing bound, charged or minted', async () => {
    const s = await t.seed({ credits: 5 })
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 1, hwids: ['m1'] })
    const res = await post(s, buildRequest(requestFields(s.appId, 'm2', licenseKey)))
    expect(res.status).toBe(409)
    expect(res.body).toEqual(errorBody('seats_full'))
    expect((await row(licenseKey)).hwids).toEqual(['m1'])
    expect(await fileRows(licenseKey)).toHaveLength(0)
    expect(await balance(s)).toBe(5)
  })

  test('a revoked license: 409 license_inactive', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { status: 'revoked' })
    const res = await post(s, buildRequest(requestFields(s.appId, 'm1', licenseKey)))
    expect(res.status).toBe(409)
    expect(res.body).toEqual(errorBody('license_inactive'))
  })
})

describe("the app's side", () => {
  test('an App-Id in upper case (as an SDK may be configured) is the same app: it activates, and the file names the app as that SDK does', async () => {
    const s = await t.seed({ credits: 5 })
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 2 })
    const upper = s.appId.toUpperCase()
    const res = await post(s, buildRequest(requestFields(upper, 'lab-upper', licenseKey)))
    expect(res.status, JSON.stringify(res.body)).toBe(201)
    // The SDKs compare the file's appId with the one they are configured with, exactly.
    const asConfigured = verifyLicenseFile(res.body.file, { appId: upper, publicKeys: [s.publicKey], hwid: 'lab-upper', nowMs: Date.now() })
    expect(asConfigured.code).toBe('ok')
    expect(res.body.appId).toBe(s.appId)
  })

  test("an HWID the app's blacklist names: 409 hwid_blocked, nothing bound, charged or minted", async () => {
    const s = await t.seed({ credits: 5 })
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 2 })
    await t.req('PUT', `/v1/apps/${s.appId}/security`, { apiKey: s.apiKey, body: { hwidBlacklist: ['lab-banned'] } })
    const res = await post(s, buildRequest(requestFields(s.appId, 'lab-banned', licenseKey)))
    expect(res.status).toBe(409)
    expect(res.body).toEqual(errorBody('hwid_blocked'))
    expect((await row(licenseKey)).hwids).toEqual([])
    expect(await fileRows(licenseKey)).toHaveLength(0)
    expect(await balance(s)).toBe(5)
  })

  test('a JSON body that lacks or mistypes request: 400 naming request', async () => {
    const s = await t.seed()
    for (const body of [{}, { request: null }, { request: 5 }]) {
      const res = await post(s, body)
      expect(res.status).toBe(400)
      expect(res.body.message).toContain('request')
    }
    const unknown = await post(s, { request: 'x', extra: 1 })
    expect(unknown.body.message).toBe('Unknown field "extra"')
  })
})

describe('refused requests: 400 bad_request saying which, and nothing changes', () => {
  const cases: [string, (appId: string, licenseKey: string) => unknown, RegExp][] = [
    ['no block', () => 'Hi, I could not attach the request.', /no -----BEGIN AUTHFORGE ACTIVATION REQUEST----- block/],
    ['truncated', (a, k) => buildRequest(requestFields(a, 'm1', k)).split('-----END')[0]!, /truncated/],
    ['bad checksum', (a, k) => buildRequest(requestFields(a, 'm1', k), { checksum: '0123456789abcdef' }), /bad checksum/],
    ['unsupported version', (a, k) => buildRequest(requestFields(a, 'm1', k), { version: '2' }), /unsupported version/],
    ['a long Version header, not quoted back', (a, k) => buildRequest(requestFields(a, 'm1', k), { version: '9'.repeat(50_000) }), /unsupported version a string of 50000 characters$/],
    ['a version nested deeper than any stack', (a) => buildRequest(`{"v":${'['.repeat(200_000)}${']'.repeat(200_000)}}`, { appIdHeader: a }), /unsupported version an array in the payload$/],
    ['a version of long text, not quoted back', (a, k) => buildRequest({ ...requestFields(a, 'm1', k), v: 'x'.repeat(100_000) }), /unsupported version a string of 100000 characters in the payload$/],
    ['a license key longer than any key', (a) => buildRequest(requestFields(a, 'm1', 'K'.repeat(65))), /the license key is 65 characters; a key is at most 64$/],
    ['a license key with a NUL (a JSON escape in the payload)', (a) => buildRequest(requestFields(a, 'm1', 'K\u00001')), /the license key holds NUL characters/],
    ['malformed payload', (a, k) => buildRequest({ ...requestFields(a, 'm1', k), typ: 'something-else' }), /malformed payload/],
    ["another app's request", (_, k) => buildRequest(requestFields(crypto.randomUUID(), 'm1', k)), /another app's request/],
    ["another app's App-Id header", (a, k) => buildRequest(requestFields(a, 'm1', k), { appIdHeader: crypto.randomUUID() }), /another app's request/],
    ['a license file', () => '-----BEGIN AUTHFORGE LICENSE-----\nVersion: 1\n\nQUJD\n-----END AUTHFORGE LICENSE-----\n', /license file/],
    ['an empty HWID', (a, k) => buildRequest(requestFields(a, '', k)), /AuthForge allows 256; this server 128/],
    ['a 129-character HWID', (a, k) => buildRequest(requestFields(a, 'h'.repeat(129), k)), /AuthForge allows 256; this server 128/],
    ['an HWID with a NUL (a JSON escape in the payload)', (a, k) => buildRequest(requestFields(a, 'm\u00001', k)), /NUL characters/],
    ['an HWID with an unpaired surrogate', (a, k) => buildRequest(requestFields(a, 'm\ud8001', k)), /unpaired surrogates/],
    [
      'an HWID that is not UTF-8 (bytes FF FE), not bound as U+FFFD',
      (a, k) => {
        const [before, after] = JSON.stringify(requestFields(a, 'ab#', k)).split('#')
        return buildRequest(Buffer.concat([Buffer.from(before!), Buffer.from([0xff, 0xfe]), Buffer.from(after!)]), { appIdHeader: a })
      },
      /the HWID is not UTF-8/,
    ],
    ['no license key', (a) => buildRequest(requestFields(a, 'm1')), /names no license/],
    ['a JSON body with an unknown field', (a, k) => ({ request: buildRequest(requestFields(a, 'm1', k)), hwids: ['x'] }), /Unknown field "hwids"/],
  ]
  test.each(cases)('%s', async (_, body, reason) => {
    const s = await t.seed({ credits: 5 })
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 3 })
    const res = await post(s, body(s.appId, licenseKey))
    expect(res.status, JSON.stringify(res.body)).toBe(400)
    expect(res.body).toEqual(errorBody('bad_request'))
    expect(res.body.message).toMatch(reason)
    expect((await row(licenseKey)).hwids).toEqual([])
    expect(await fileRows(licenseKey)).toHaveLength(0)
    expect(await balance(s)).toBe(5)
  })

  test.each([
    ['longer than any key', 'K'.repeat(73)],
    ['holding a NUL', 'K\u00001'],
  ])("a request whose own license key is unusable (%s) is answered for the key the vendor gives", async (_, written) => {
    const s = await t.seed({ credits: 5 })
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 3 })
    const res = await post(s, { request: buildRequest(requestFields(s.appId, 'm1', written)), licenseKey })
    expect(res.status, JSON.stringify(res.body)).toBe(201)
    expect((await row(licenseKey)).hwids).toEqual(['m1'])
    expect(await balance(s)).toBe(4)
  })

  test("a license of another app of the account: 400, nothing bound", async () => {
    const s = await t.seed({ credits: 5 })
    const otherApp = await t.req('POST', '/v1/apps', { apiKey: s.apiKey, body: { name: 'Other' } })
    expect(otherApp.status, JSON.stringify(otherApp.body)).toBe(201)
    const licenseKey = await insertLicense(t.ctx, otherApp.body.appId)
    const res = await post(s, buildRequest(requestFields(s.appId, 'm1', licenseKey)))
    expect(res.status).toBe(400)
    expect(res.body.message).toMatch(/belongs to another app/)
    expect((await row(licenseKey)).hwids).toEqual([])
    expect(await fileRows(licenseKey)).toHaveLength(0)
    expect(await balance(s)).toBe(5)
  })
})

describe('ownership', () => {
  test("403 for another account's app or license, 404 for an absent license, 401 without a key", async () => {
    const s = await t.seed()
    const stranger = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId)
    const request = buildRequest(requestFields(s.appId, 'm1', licenseKey))
    const foreignApp = await post(stranger, request, { appId: s.appId })
    expect(foreignApp.status).toBe(403)
    expect(foreignApp.body).toEqual(errorBody('forbidden'))
    const foreignLicense = await post(stranger, buildRequest(requestFields(stranger.appId, 'm1', licenseKey)))
    expect(foreignLicense.status).toBe(403)
    expect(foreignLicense.body).toEqual(errorBody('forbidden'))
    const absent = await post(s, buildRequest(requestFields(s.appId, 'm1', 'ZZZZ-ZZZZ-ZZZZ-ZZZZ')))
    expect(absent.status).toBe(404)
    expect(absent.body).toEqual(errorBody('not_found'))
    const anonymous = await t.req('POST', path(s.appId), { body: request, headers: { 'content-type': 'text/plain' } })
    expect(anonymous.status).toBe(401)
    expect((await row(licenseKey)).hwids).toEqual([])
  })
})

describe('the body parser', () => {
  test('a text/plain body elsewhere on /v1 is refused with 400, not parsed as JSON', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { hwids: ['m1'] })
    const res = await t.req('POST', `/v1/licenses/${licenseKey}/offline-files`, {
      apiKey: s.apiKey,
      body: '{}',
      headers: { 'content-type': 'text/plain' },
    })
    expect(res.status).toBe(400)
    expect(res.body).toEqual(errorBody('bad_request'))
    expect(res.body.message).toBe('The body must be a JSON object')
  })

  test('the request text as a JSON string (not text/plain, not { request }) is refused, and nothing is minted', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 2 })
    const res = await t.req('POST', path(s.appId), {
      apiKey: s.apiKey,
      body: JSON.stringify(buildRequest(requestFields(s.appId, 'm1', licenseKey))),
      headers: { 'content-type': 'application/json' },
    })
    expect(res.status).toBe(400)
    expect(res.body).toEqual(errorBody('bad_request'))
    expect(res.body.message).toBe('The body must be a JSON object')
    expect((await row(licenseKey)).hwids).toEqual([])
  })

  test('a text/plain body over the /v1 limit is 413', async () => {
    const s = await t.seed()
    const res = await post(s, 'x'.repeat(1024 * 1024 + 1))
    expect(res.status).toBe(413)
    expect(res.body).toEqual(errorBody('bad_request'))
  })

  test('the OpenAPI document names both body types', async () => {
    const res = await t.req('GET', '/docs/json')
    const op = res.body.paths['/v1/apps/{appId}/activation-requests'].post
    expect(Object.keys(op.requestBody.content).sort()).toEqual(['application/json', 'text/plain'])
    expect(op.tags).toEqual(['Offline licenses'])
    expect(Object.keys(op.responses)).toEqual(expect.arrayContaining(['201', '400', '402', '403', '404', '409']))
  })
})
