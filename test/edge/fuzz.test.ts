/**
 * Property-based fuzzing of every operation in the OpenAPI document (/docs/json): a route added later
 * is fuzzed with no change here. Each run sends one request built from the operation's own schemas,
 * mostly made hostile (unknown fields, wrong types, numbers as text, NUL and lone surrogates, huge,
 * negative and fractional numbers, dates PostgreSQL cannot store, null, arrays, empty and deeply
 * nested bodies, bad path and query parameters, crafted cursors, bad credentials). It asserts: never
 * a 5xx, and after any 4xx the database rows of both test accounts are what they were before.
 *
 * CI runs a fixed seed and FUZZ_RUNS_DEFAULT runs per operation; `npm run fuzz` takes FUZZ_RUNS and
 * FUZZ_SEED from the environment to run it long, and FUZZ_TRACE=1 prints every request and answer.
 */
import { describe, expect, setDefaultTimeout, test } from 'bun:test'
import fc from 'fast-check'
import { makeTestApp } from '../support/helpers'
import { hwid, insertLicense, nonce } from '../support/client'
import { accountDigest } from '../support/account-digest'

const FUZZ_RUNS_DEFAULT = 30
const RUNS = Number(process.env.FUZZ_RUNS ?? FUZZ_RUNS_DEFAULT)
const SEED = Number(process.env.FUZZ_SEED ?? 20261124)
const TRACE = process.env.FUZZ_TRACE === '1'
// A long run takes as long as it takes; the CI run stays inside the suite's own timeout.
if (process.env.FUZZ_RUNS) setDefaultTimeout(24 * 3600 * 1000)

interface Schema {
  type?: string
  anyOf?: Schema[]
  const?: unknown
  enum?: unknown[]
  properties?: Record<string, Schema>
  required?: string[]
  patternProperties?: Record<string, Schema>
  additionalProperties?: boolean | Schema
  items?: Schema
  minimum?: number
  maximum?: number
  minLength?: number
  maxLength?: number
  'x-characters'?: [number, number]
  maxItems?: number
  format?: string
}

interface Parameter {
  in: 'path' | 'query' | 'header'
  name: string
  required?: boolean
  schema?: Schema
}

interface Operation {
  method: string
  path: string
  parameters: Parameter[]
  body: Schema | null
}

/** What the account under test holds right now: valid values to build requests from. */
interface World {
  apiKey: string
  otherApiKey: string
  appId: string
  otherAppId: string
  appSecret: string
  licenseKeys: string[]
  otherLicenseKey: string
  webhookIds: string[]
  sessionToken: string
  sessionHwid: string
  cursor: string | null
}

const b64 = (text: string) => Buffer.from(text, 'utf8').toString('base64url')

// ---- hostile values ----------------------------------------------------------------------------

/**
 * Deep nesting stands in a value as a marker string, spelled out only in the body text: as a JS value it
 * would overflow this test's own JSON.stringify.
 */
const deepNesting = (depth: number) => `\u0001deep:${depth}`
const spellOutNesting = (json: string) =>
  json.replace(/"\\u0001deep:(\d+)"/g, (_, depth) => `${'['.repeat(Number(depth))}${']'.repeat(Number(depth))}`)

/** Values no field of this API accepts in their place, whatever its type. */
const hostileValue: fc.Arbitrary<unknown> = fc.oneof(
  // What PostgreSQL cannot store, alone or inside otherwise fine text.
  {
    weight: 5,
    arbitrary: fc
      .tuple(fc.string({ maxLength: 8 }), fc.constantFrom('\u0000', '\ud800', '\udfff', '\ud800\ud800', '\udc00\ud800'), fc.string({ maxLength: 8 }))
      .map(([a, bad, b]) => `${a}${bad}${b}`),
  },
  { weight: 2, arbitrary: fc.constantFrom('0x10', '1e1', ' 3', '3', '-1', '3.0', '', 'null', 'true', 'NaN', 'Infinity') },
  {
    weight: 2,
    arbitrary: fc.constantFrom(
      '0000-01-01T00:00:00Z',
      '9999-12-31T23:59:59-23:59',
      '+275760-09-13T00:00:00Z',
      '-000001-01-01T00:00:00Z',
      '1969-12-31T23:59:59Z',
      '2030-02-30',
      '2030-01-01T24:00:00Z',
    ),
  },
  { weight: 2, arbitrary: fc.constantFrom(null, true, false, 0, -1, 1.5, -0.5, 1e308, -1e308, 2 ** 53 + 2, 1e-320) },
  { weight: 2, arbitrary: fc.constantFrom([], {}, [null], [[]], { $ne: 1 }, { __proto__: { polluted: true } }) },
  { weight: 1, arbitrary: fc.oneof(fc.integer({ min: 1, max: 100 }), fc.integer({ min: 1, max: 300_000 })).map(deepNesting) },
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 70_000 }).map((n) => 'x'.repeat(n)) },
  { weight: 1, arbitrary: fc.string({ unit: 'binary', maxLength: 40 }) },
)

const hostileText: fc.Arbitrary<string> = fc.oneof(
  fc.constantFrom('%00', 'a%00b', '%ED%A0%80', '%ED%BF%BF', '%', '%zz', '..', '%2e%2e', '%2F', 'null', '-1', '0x10', ' '),
  fc.constantFrom('00000000-0000-0000-0000-000000000000', 'AAAA-BBBB-CCCC-DDDD', 'wh_nope'),
  fc.integer({ min: 1, max: 6000 }).map((n) => 'a'.repeat(n)),
  fc.string({ unit: 'binary', maxLength: 30 }).map(encodeURIComponentLoose),
)

/** encodeURIComponent that keeps a lone surrogate as its would-be UTF-8 bytes instead of throwing. */
function encodeURIComponentLoose(text: string): string {
  return [...text]
    .map((ch) => {
      const code = ch.charCodeAt(0)
      return code >= 0xd800 && code <= 0xdfff && ch.length === 1
        ? `%${(0xe0 | (code >> 12)).toString(16)}%${(0x80 | ((code >> 6) & 0x3f)).toString(16)}%${(0x80 | (code & 0x3f)).toString(16)}`
        : encodeURIComponent(ch)
    })
    .join('')
}

const craftedCursor: fc.Arbitrary<string> = fc.oneof(
  fc.constantFrom(
    b64('0000-01-01T00:00:00.000Z|AAAA-BBBB-CCCC-DDDD'),
    b64('+275760-09-13T00:00:00.000Z|AAAA-BBBB-CCCC-DDDD'),
    b64('2030-01-01T00:00:00.000Z|AAAA\u0000BBBB'),
    b64(JSON.stringify({ createdAt: '2030-01-01', key: "' OR 1=1 --" })),
    `${b64('2999-01-01T00:00:00.000Z|ZZZZ-ZZZZ-ZZZZ-ZZZZ')}.${'A'.repeat(22)}`,
    '.',
    '***',
  ),
  fc.string({ unit: 'binary', maxLength: 60 }).map((s) => b64(s)),
  fc.tuple(fc.string({ maxLength: 40 }), fc.string({ maxLength: 22 })).map(([a, b]) => `${b64(a)}.${b}`),
)

// ---- valid values, from the schema and the world ------------------------------------------------

type Gen = (world: World) => unknown

/** Values some fields need to be right for a request to pass (by field name): drawn from the world. */
const NAMED: Record<string, fc.Arbitrary<Gen>> = {
  appId: fc.constant((w: World) => w.appId),
  appSecret: fc.constant((w: World) => w.appSecret),
  licenseKey: fc.nat().map((i) => (w: World) => w.licenseKeys[i % Math.max(1, w.licenseKeys.length)] ?? 'NONE-NONE-NONE-NONE'),
  sessionToken: fc.constant((w: World) => w.sessionToken),
  hwid: fc.oneof(fc.constant((w: World) => w.sessionHwid), fc.constant(() => hwid())),
  nonce: fc.constant(() => nonce()),
  url: fc.constant(() => 'https://127.0.0.1:9/hook'),
  events: fc.constant(() => ['license.created']),
  quantity: fc.integer({ min: 1, max: 3 }).map((n) => () => n),
  expiresAt: fc
    .oneof(fc.constant(null), fc.date({ min: new Date('2000-01-01'), max: new Date('9000-01-01'), noInvalidDate: true }))
    .map((d) => () => d && d.toISOString()),
  value: fc.constantFrom('hwid-0123456789', '203.0.113.7', '2001:db8::1').map((v) => () => v),
  cursor: fc.constant((w: World) => w.cursor ?? undefined),
}

const plain = <T>(arb: fc.Arbitrary<T>): fc.Arbitrary<Gen> => arb.map((v) => () => v)

function validFromSchema(schema: Schema, name?: string): fc.Arbitrary<Gen> {
  const named = name ? NAMED[name] : undefined
  if (named) return named
  if (schema.anyOf) return fc.oneof(...schema.anyOf.map((s) => validFromSchema(s, name)))
  if (schema.const !== undefined) return plain(fc.constant(schema.const))
  if (schema.enum) return plain(fc.constantFrom(...schema.enum))
  switch (schema.type) {
    case 'string':
    {
      // Chars' bounds are in its pattern, named by x-characters.
      const [lo, hi] = schema['x-characters'] ?? [schema.minLength ?? 0, schema.maxLength ?? 20]
      return plain(fc.string({ minLength: lo, maxLength: Math.min(hi, 20) }))
    }
    case 'integer':
      return plain(fc.integer({ min: schema.minimum ?? -1000, max: Math.min(schema.maximum ?? 1000, 1000) }))
    case 'number':
      return plain(fc.double({ noNaN: true, noDefaultInfinity: true, min: -1e6, max: 1e6 }))
    case 'boolean':
      return plain(fc.boolean())
    case 'null':
      return plain(fc.constant(null))
    case 'array':
      return fc
        .array(validFromSchema(schema.items ?? {}), { maxLength: Math.min(schema.maxItems ?? 3, 3) })
        .map((gens) => (w: World) => gens.map((g) => g(w)))
    case 'object':
      return objectFromSchema(schema)
    default:
      return plain(fc.string({ maxLength: 5 }))
  }
}

function objectFromSchema(schema: Schema): fc.Arbitrary<Gen> {
  const patterned = Object.values(schema.patternProperties ?? {})[0]
  if (patterned) {
    return fc
      .dictionary(fc.string({ minLength: 1, maxLength: 8 }), validFromSchema(patterned), { maxKeys: 4 })
      .map((entries) => (w: World) => Object.fromEntries(Object.entries(entries).map(([k, g]) => [k, g(w)])))
  }
  const props = Object.entries(schema.properties ?? {})
  const required = new Set(schema.required ?? [])
  return fc
    .tuple(...props.map(([key, s]) => fc.tuple(fc.constant(key), validFromSchema(s, key), fc.boolean())))
    .map((fields) => (w: World) => {
      const out: Record<string, unknown> = {}
      for (const [key, gen, include] of fields) if (required.has(key) || include) out[key] = gen(w)
      return out
    })
}

// ---- mutations ---------------------------------------------------------------------------------

type BodyPlan = { kind: 'json'; gen: Gen } | { kind: 'raw'; text: string }

/** Turns a valid body into a hostile one (or, now and then, leaves it valid). */
function bodyPlan(schema: Schema): fc.Arbitrary<BodyPlan> {
  const valid = validFromSchema(schema)
  const fields = Object.keys(schema.properties ?? {})
  const mutate = (f: (value: Record<string, unknown>) => unknown) =>
    valid.map((gen): BodyPlan => ({ kind: 'json', gen: (w) => f(gen(w) as Record<string, unknown>) }))
  const options: fc.WeightedArbitrary<BodyPlan>[] = [
    { weight: 2, arbitrary: valid.map((gen): BodyPlan => ({ kind: 'json', gen })) },
    {
      weight: 1,
      arbitrary: fc
        .tuple(fc.oneof(fc.string({ minLength: 1, maxLength: 12 }), hostileValue.map(String)), hostileValue)
        .chain(([key, v]) => mutate((body) => ({ ...body, [key]: v }))),
    },
    { weight: 1, arbitrary: hostileValue.map((v): BodyPlan => ({ kind: 'json', gen: () => v })) },
    {
      weight: 1,
      arbitrary: fc
        .constantFrom('', '{', '{"a":', 'nul', '[1,]', '\u0000', '{"a":1}{"b":2}', '"\\ud800"', '{"a":"\\u0000"}')
        .map((text): BodyPlan => ({ kind: 'raw', text })),
    },
  ]
  if (fields.length > 0) {
    const field = fc.constantFrom(...fields)
    options.push(
      { weight: 6, arbitrary: fc.tuple(field, hostileValue).chain(([key, v]) => mutate((body) => ({ ...body, [key]: v }))) },
      {
        weight: 2,
        arbitrary: fc
          .tuple(field, hostileValue)
          .chain(([key, v]) => mutate((body) => ({ ...body, [key]: Array.isArray(body[key]) ? [...(body[key] as unknown[]), v] : [v] }))),
      },
      {
        weight: 1,
        arbitrary: field.chain((key) =>
          mutate((body) => {
            const { [key]: _dropped, ...rest } = body
            return rest
          }),
        ),
      },
    )
  }
  return fc.oneof(...options)
}

interface RequestPlan {
  pathValues: Record<string, Gen | string>
  query: [string, Gen | string][]
  body: BodyPlan | null
  auth: 'valid' | 'none' | 'garbage' | 'other' | 'lowercase'
}

function pathValue(name: string): fc.Arbitrary<Gen | string> {
  const valid: fc.Arbitrary<Gen> =
    name === 'appId'
      ? fc.constantFrom<Gen>((w) => w.appId, (w) => w.otherAppId)
      : name === 'licenseKey'
        ? fc.oneof(NAMED.licenseKey as fc.Arbitrary<Gen>, fc.constant((w: World) => w.otherLicenseKey))
        : name === 'hwid'
          ? fc.oneof(fc.constant((w: World) => w.sessionHwid), plain(fc.string({ minLength: 1, maxLength: 8 }).map(encodeURIComponentLoose)))
          : name === 'webhookId'
          ? fc.nat().map((i) => (w: World) => w.webhookIds[i % Math.max(1, w.webhookIds.length)] ?? 'wh_none')
          : plain(fc.string({ minLength: 1, maxLength: 8 }).map(encodeURIComponentLoose))
  return fc.oneof({ weight: 4, arbitrary: valid }, { weight: 1, arbitrary: hostileText })
}

function queryPlan(params: Parameter[]): fc.Arbitrary<[string, Gen | string][]> {
  const each = params.map((p) =>
    fc.oneof(
      { weight: 2, arbitrary: validFromSchema(p.schema ?? {}, p.name).map((g): [string, Gen | string][] => [[p.name, g]]) },
      { weight: 1, arbitrary: hostileText.map((v): [string, Gen | string][] => [[p.name, v]]) },
      {
        weight: 1,
        arbitrary: (p.name === 'cursor'
          ? craftedCursor
          : fc.constantFrom('0x10', '1e1', '-1', '1.5', '99999999999999999999')
        ).map((v): [string, Gen | string][] => [[p.name, encodeURIComponent(v)]]),
      },
      { weight: 1, arbitrary: fc.constant<[string, Gen | string][]>([]) },
      {
        weight: 1,
        arbitrary: fc.tuple(hostileText, hostileText).map(([a, b]): [string, Gen | string][] => [[p.name, a], [p.name, b]]),
      },
    ),
  )
  const unknown = fc.oneof(
    { weight: 4, arbitrary: fc.constant(null) },
    {
      weight: 1,
      arbitrary: fc
        .tuple(fc.constantFrom('extra', 'appId[]', '__proto__', 'limit'), hostileText)
        .map(([k, v]): [string, string] => [k, v]),
    },
  )
  return fc.tuple(fc.tuple(...each), unknown).map(([lists, extra]) => [...lists.flat(), ...(extra ? [extra] : [])])
}

function requestPlan(op: Operation): fc.Arbitrary<RequestPlan> {
  const pathParams = op.parameters.filter((p) => p.in === 'path')
  return fc.record({
    pathValues: fc.record(Object.fromEntries(pathParams.map((p) => [p.name, pathValue(p.name)]))),
    query: queryPlan(op.parameters.filter((p) => p.in === 'query')),
    // A route that takes no body gets one now and then: it must be ignored, or refused, never a 5xx.
    body: op.body
      ? bodyPlan(op.body)
      : fc.oneof({ weight: 4, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: bodyPlan({ type: 'object' }) }),
    auth: fc.oneof(
      { weight: 12, arbitrary: fc.constant('valid' as const) },
      { weight: 2, arbitrary: fc.constant('lowercase' as const) },
      { weight: 1, arbitrary: fc.constantFrom('none' as const, 'garbage' as const, 'other' as const) },
    ),
  }) as fc.Arbitrary<RequestPlan>
}

// ---- the run -----------------------------------------------------------------------------------

describe('fuzzing every operation of the OpenAPI document', async () => {
  // Each request is a second later than the last: the per-key and per-IP limits never run dry, so
  // the requests reach validation and the routes rather than stopping at 429.
  let skew = 0
  const t = await makeTestApp({ clock: () => Date.now() + skew })
  const s = await t.seed({ credits: 1_000_000 })
  const other = await t.seed({ credits: 1_000 })
  const doc = (await t.req('GET', '/docs/json')).body
  const operations: Operation[] = Object.entries<Record<string, any>>(doc.paths).flatMap(([path, ops]) =>
    Object.entries(ops).map(([method, op]) => ({
      method: method.toUpperCase(),
      path,
      parameters: (op.parameters ?? []) as Parameter[],
      body: op.requestBody?.content?.['application/json']?.schema ?? null,
    })),
  )
  const otherLicense = await insertLicense(t.ctx, other.appId)

  const world: World = {
    apiKey: s.apiKey,
    otherApiKey: other.apiKey,
    appId: s.appId,
    otherAppId: other.appId,
    appSecret: s.appSecret,
    licenseKeys: [],
    otherLicenseKey: otherLicense,
    webhookIds: [],
    sessionToken: '',
    sessionHwid: hwid(),
    cursor: null,
  }

  /**
   * Brings the world up to date with the database, and keeps a license, a webhook and a session alive (the
   * app enabled, its secret known: a fuzzed PATCH may disable it, a fuzzed rotation replace the secret).
   */
  async function refreshWorld() {
    await t.req('PATCH', `/v1/apps/${s.appId}`, { apiKey: s.apiKey, body: { disabled: false } })
    const listed = await t.req('GET', `/v1/licenses?appId=${s.appId}&limit=2`, { apiKey: s.apiKey })
    if (listed.body.licenses?.length === 0) await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    const again = await t.req('GET', `/v1/licenses?appId=${s.appId}&limit=200`, { apiKey: s.apiKey })
    world.licenseKeys = again.body.licenses.map((l: { licenseKey: string }) => l.licenseKey)
    world.cursor = (await t.req('GET', `/v1/licenses?appId=${s.appId}&limit=1`, { apiKey: s.apiKey })).body.cursor
    const hooks = await t.req('GET', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey })
    if (hooks.body.webhooks.length === 0) {
      await t.req('POST', `/v1/apps/${s.appId}/webhooks`, {
        apiKey: s.apiKey,
        body: { url: 'https://127.0.0.1:9/hook', events: ['license.validated', 'license.created'] },
      })
    }
    world.webhookIds = (await t.req('GET', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey })).body.webhooks.map(
      (h: { webhookId: string }) => h.webhookId,
    )
    const validate = () =>
      t.req('POST', '/auth/validate', {
        body: { appId: s.appId, appSecret: world.appSecret, licenseKey: world.licenseKeys[0], hwid: world.sessionHwid, nonce: nonce() },
      })
    let login = await validate()
    if (login.body.error === 'invalid_app') {
      world.appSecret = (await t.req('POST', `/v1/apps/${s.appId}/secret`, { apiKey: s.apiKey })).body.appSecret
      login = await validate()
    }
    if (login.status === 200) world.sessionToken = JSON.parse(Buffer.from(login.body.payload, 'base64').toString()).sessionToken
  }

  const snapshot = async () => {
    await t.ctx.validatedEvents.flush()
    return `${await accountDigest(t.ctx, s.accountId)} ${await accountDigest(t.ctx, other.accountId)}`
  }

  function render(op: Operation, plan: RequestPlan) {
    const resolve = (v: Gen | string) => (typeof v === 'string' ? v : String(v(world) ?? ''))
    let path = op.path
    for (const [name, value] of Object.entries(plan.pathValues)) path = path.replace(`{${name}}`, resolve(value))
    const query = plan.query
      .map(([k, v]) => [k, typeof v === 'string' ? v : v(world)] as const)
      .filter(([, v]) => v !== undefined)
      .map(([k, v]) => `${encodeURIComponent(k)}=${typeof v === 'string' ? v : encodeURIComponent(JSON.stringify(v) ?? '')}`)
    if (query.length > 0) path += `?${query.join('&')}`
    const body =
      plan.body === null
        ? undefined
        : plan.body.kind === 'raw'
          ? plan.body.text
          : spellOutNesting(JSON.stringify(plan.body.gen(world)) ?? '')
    const headers: Record<string, string> = {
      valid: { authorization: `Bearer ${world.apiKey}` },
      none: {},
      garbage: { authorization: 'Bearer svc_live_\u00e9\u00e9 x' },
      other: { authorization: `Bearer ${world.otherApiKey}` },
      lowercase: { authorization: `bearer ${world.apiKey}` },
    }[plan.auth]
    return { path, body, headers }
  }

  await refreshWorld()

  for (const op of operations) {
    test(`${op.method} ${op.path}: no 5xx, and no change after a 4xx`, async () => {
      let before = await snapshot()
      await fc.assert(
        fc.asyncProperty(requestPlan(op), async (plan) => {
          skew += 1000
          const { path, body, headers } = render(op, plan)
          const res = await t.req(op.method, path, { body, headers })
          const shown = `${op.method} ${path} ${JSON.stringify(body?.slice(0, 300))} -> ${res.status} ${JSON.stringify(res.body).slice(0, 300)}`
          if (TRACE) console.log(shown)
          expect(res.status, shown).toBeLessThan(500)
          const after = await snapshot()
          if (res.status >= 400) expect(after, `state changed after ${shown}`).toBe(before)
          else if (after !== before) {
            // A valid request may change things: look at the world again before the next one.
            await refreshWorld()
            before = await snapshot()
          }
        }),
        { numRuns: RUNS, seed: SEED, endOnFailure: true },
      )
    })
  }
})
