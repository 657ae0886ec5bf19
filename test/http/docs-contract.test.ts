import { beforeAll, describe, expect, test } from 'bun:test'
import type { TSchema } from '@sinclair/typebox'
import { Value } from '@sinclair/typebox/value'
import Ajv2020 from 'json-schema-ajv/dist/2020'
import { SignedPayload } from '../../src/client-auth/model'
import { LICENSE_FILE_TYPE } from '../../src/licenses/offline/routes'
import { SIGNED_PAYLOAD_MODEL } from '../../src/signing/model'
import { decode, hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp, type TestApp } from '../support/helpers'

type Json = Record<string, any>
let t: TestApp
let doc: Json
/** Every operation of the document, with where it is. */
let operations: { where: string; path: string; method: string; op: Json }[]

beforeAll(async () => {
  t = await makeTestApp()
  doc = (await t.req('GET', '/docs/json')).body
  operations = Object.entries<Json>(doc.paths).flatMap(([path, item]) =>
    Object.entries<Json>(item).map(([method, op]) => ({ where: `${method.toUpperCase()} ${path}`, path, method, op })),
  )
})

const VERBS = ['get', 'list', 'create', 'update', 'delete', 'replace', 'rotate', 'add', 'remove', 'release', 'mint']
const OTHER_VERBS = ['answer', 'validate', 'send', 'report', 'ping', 'check']

describe('operations', () => {
  test('each has a unique camelCase operationId that starts with a verb', () => {
    const ids = operations.map((o) => o.op.operationId)
    expect(new Set(ids).size).toBe(ids.length)
    const shape = new RegExp(`^(?:${[...VERBS, ...OTHER_VERBS].join('|')})(?:[A-Z][a-z0-9]*)+$`)
    for (const { where, op } of operations) expect(op.operationId, where).toMatch(shape)
  })

  test('operationIds are stable: the ones clients generate code from are still there', () => {
    const ids = new Set(operations.map((o) => o.op.operationId))
    for (const id of ['createLicenses', 'getLicense', 'updateLicense', 'validateLicense', 'sendHeartbeat', 'reportTampering'])
      expect(ids.has(id), id).toBe(true)
  })

  test('every response has a description', () => {
    for (const { where, op } of operations) {
      for (const [status, response] of Object.entries<Json>(op.responses)) {
        expect(typeof response.description, `${where} ${status}`).toBe('string')
        expect(response.description.length, `${where} ${status}`).toBeGreaterThan(0)
      }
    }
  })

  test('bodies are JSON; only the activation request also takes text/plain, and only it accepts it', async () => {
    const { apiKey, appId } = await t.seed()
    for (const { where, path, method, op } of operations) {
      if (!op.requestBody) continue
      const types = Object.keys(op.requestBody.content)
      const takesText = path === '/v1/apps/{appId}/activation-requests'
      expect(types, where).toEqual(takesText ? ['application/json', 'text/plain'] : ['application/json'])
      if (takesText || !path.startsWith('/v1/')) continue
      // What the document leaves out the server refuses: text/plain reaches a /v1 route as a string.
      const url = path.replace('{appId}', appId).replace('{licenseKey}', 'K7QM-3XWT-9HFP-2RDN').replace('{webhookId}', 'wh_x')
      const res = await t.req(method.toUpperCase(), url, {
        apiKey,
        body: JSON.stringify(op.requestBody.content['application/json'].schema.examples?.[0] ?? {}),
        headers: { 'content-type': 'text/plain' },
      })
      expect(res.status, where).toBe(400)
    }
  })

  test('responses are JSON; a mint also serves the file itself, /metrics text', () => {
    const mints = ['POST /v1/licenses/{licenseKey}/offline-files', 'POST /v1/apps/{appId}/activation-requests']
    for (const { where, op } of operations) {
      for (const [status, response] of Object.entries<Json>(op.responses)) {
        const types = Object.keys(response.content ?? {})
        if (where === 'GET /metrics') expect(types).toEqual(['text/plain'])
        else if (mints.includes(where) && status === '201') expect(types).toEqual(['application/json', LICENSE_FILE_TYPE])
        else expect(types, `${where} ${status}`).toEqual(['application/json'])
      }
    }
  })

  test('every request body and every response has examples', () => {
    for (const { where, op } of operations) {
      const body = op.requestBody?.content['application/json']?.schema
      if (body) expect(body.examples?.length, `${where} body`).toBeGreaterThan(0)
      for (const [status, response] of Object.entries<Json>(op.responses)) {
        const schema = response.content?.['application/json']?.schema
        if (schema) expect(schema.examples?.length, `${where} ${status}`).toBeGreaterThan(0)
      }
    }
  })
})

/** Every schema node under `node` (properties, items, unions, records), with its path. */
function* nodes(node: unknown, at: string): Generator<[string, TSchema]> {
  if (!node || typeof node !== 'object') return
  const schema = node as Json
  yield [at, schema as TSchema]
  for (const [key, child] of Object.entries(schema.properties ?? {})) yield* nodes(child, `${at}.${key}`)
  for (const child of Object.values(schema.patternProperties ?? {})) yield* nodes(child, `${at}{*}`)
  for (const [i, child] of (schema.anyOf ?? []).entries()) yield* nodes(child, `${at}|${i}`)
  if (schema.items) yield* nodes(schema.items, `${at}[]`)
}

test('every example in the route schemas passes the schema it sits on (what validation checks)', () => {
  let checked = 0
  for (const route of t.app.routes) {
    const hooks = route.hooks as Json
    const schemas: [string, unknown][] = [
      ['body', hooks.body],
      ['params', hooks.params],
      ['query', hooks.query],
      ...Object.entries<unknown>(hooks.response ?? {}).map(([status, s]): [string, unknown] => [status, s]),
    ]
    for (const [part, root] of schemas) {
      for (const [at, schema] of nodes(root, `${route.method} ${route.path} ${part}`)) {
        for (const example of (schema as Json).examples ?? []) {
          checked++
          expect(Value.Check(schema, example), `${at}: ${JSON.stringify(example)}`).toBe(true)
        }
      }
    }
  }
  expect(checked).toBeGreaterThan(100)
  // The payload schema is no route's: its example is checked here.
  for (const example of SignedPayload.examples) expect(Value.Check(SignedPayload, example)).toBe(true)
})

describe('the signed payload', () => {
  test('has a component schema, which validate and heartbeat reference from their payload field', () => {
    const component = doc.components.schemas[SIGNED_PAYLOAD_MODEL]
    expect(Object.keys(component.properties)).toEqual(Object.keys(SignedPayload.properties))
    expect(component.required).toEqual(SignedPayload.required)
    for (const path of ['/auth/validate', '/auth/heartbeat']) {
      const response = doc.paths[path].post.responses['200']
      expect(response.description).toContain(SIGNED_PAYLOAD_MODEL)
      const payload = response.content['application/json'].schema.properties.payload
      expect(payload).toMatchObject({
        contentEncoding: 'base64',
        contentMediaType: 'application/json',
        contentSchema: { $ref: `#/components/schemas/${SIGNED_PAYLOAD_MODEL}` },
      })
    }
  })

  test('a real payload, from validate and from heartbeat, decodes to a SignedPayload with no field it leaves out', async () => {
    const { apiKey, appId, appSecret } = await t.seed()
    await t.req('PUT', `/v1/apps/${appId}/variables`, { apiKey, body: { tier: 'pro', seats: 5 } })
    const created = await t.req('POST', '/v1/licenses', { apiKey, body: { appId, label: 'Order 1', expiresAt: '2099-01-01T00:00:00Z' } })
    const licenseKey = created.body.licenses[0].licenseKey
    const device = hwid()
    const validated = await t.req('POST', '/auth/validate', { body: { appId, appSecret, licenseKey, hwid: device, nonce: nonce() } })
    expect(validated.status).toBe(200)
    const first = decode(validated.body.payload)
    const beat = await t.req('POST', '/auth/heartbeat', { body: { appId, sessionToken: first.sessionToken, hwid: device } })
    expect(beat.status).toBe(200)
    const documented = Object.keys(doc.components.schemas[SIGNED_PAYLOAD_MODEL].properties)
    for (const payload of [first, decode(beat.body.payload)]) {
      expect([...Value.Errors(SignedPayload, payload)].map((e) => `${e.path}: ${e.message}`)).toEqual([])
      for (const key of Object.keys(payload)) expect(documented, `payload field ${key}`).toContain(key)
    }
    expect(first.appVariables).toEqual({ tier: 'pro', seats: 5 })
  })
})

describe('a body the server refuses under a rule of its schema, the document refuses too (what a generated client or validator checks)', () => {
  const emojis = (n: number) => '\u{1F600}'.repeat(n)
  const names = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, i]))
  // [operation in the document, a body it must refuse, a body of the same operation the server takes]
  const cases: [string, unknown, unknown][] = [
    ['PUT /v1/apps/{appId}/variables', names(51), names(50)],
    ['PUT /v1/apps/{appId}/variables', { [emojis(65)]: 1 }, { [emojis(64)]: 1 }],
    ['PUT /v1/apps/{appId}/variables', { '': 1 }, { a: 1 }],
    ['PUT /v1/licenses/{licenseKey}/variables', { ['n'.repeat(65)]: 1 }, { ['n'.repeat(64)]: 1 }],
    ['PUT /v1/apps/{appId}/security', { hwidBlacklist: [emojis(129)] }, { hwidBlacklist: [emojis(128)] }],
    ['PUT /v1/apps/{appId}/security', { ipBlacklist: [`203.0.113.7${' '.repeat(35)}`] }, { ipBlacklist: ['203.0.113.7'] }],
    ['POST /v1/apps/{appId}/security/blacklist', { type: 'hwid', value: emojis(129) }, { type: 'hwid', value: emojis(128) }],
    ['POST /v1/apps/{appId}/security/blacklist', { type: 'ip', value: '1'.repeat(46) }, { type: 'ip', value: '203.0.113.8' }],
    ['PUT /v1/licenses/{licenseKey}', { action: 'extend' }, { action: 'extend', expiresAt: null }],
    ['PUT /v1/licenses/{licenseKey}', { action: 'revoke', expiresAt: '2030-01-01T00:00:00Z' }, { action: 'revoke' }],
    ['PUT /v1/licenses/{licenseKey}', { action: 'extend', expiresAt: 'next week' }, { action: 'extend', expiresAt: '2030-01-01' }],
    ['POST /v1/licenses', { expiresAt: 'tomorrow' }, { expiresAt: '2030-01-01T00:00:00+02:00' }],
    ['POST /v1/licenses/{licenseKey}/offline-files', { expiresAt: 'soon' }, { expiresAt: '2029-06-01T00:00:00Z' }],
    ['POST /auth/selfban', {}, { sessionToken: 'x' }],
    ['POST /auth/selfban', { licenseKey: 'K', nonce: nonce() }, { licenseKey: 'K', nonce: nonce(), appSecret: 's' }],
  ]

  test.each(cases)('%s: %j', async (where, refused, taken) => {
    const s = await t.seed({ credits: 10 })
    const key = await insertLicense(t.ctx, s.appId, { expiresAt: new Date('2030-01-01T00:00:00Z') })
    const [method, path] = where.split(' ') as [string, string]
    const fill = (body: unknown) => {
      if (path === '/v1/licenses') return { appId: s.appId, ...(body as object) }
      if (path === '/auth/selfban') return { appId: s.appId, hwid: hwid(), ...(body as object) }
      return body
    }
    const schema = doc.paths[path][method.toLowerCase()].requestBody.content['application/json'].schema
    const check = new Ajv2020({ strict: false, allErrors: false }).compile(schema)
    expect(check(fill(refused)), `the document takes ${JSON.stringify(refused)}`).toBe(false)
    expect(check(fill(taken)), JSON.stringify(check.errors)).toBe(true)
    const url = path.replace('{appId}', s.appId).replace('{licenseKey}', key)
    const res = await t.req(method, url, { apiKey: s.apiKey, body: fill(refused) })
    expect(res.status, JSON.stringify(res.body)).toBe(400)
  })
})
