import { describe, expect, test } from 'bun:test'
import { makeTestApp } from '../support/helpers'

const toOpenApiPath = (path: string) => path.replace(/:([A-Za-z0-9_]+)/g, '{$1}')

/** Every `$ref` in the document, so each can be checked to point at a component that exists. */
function refs(node: unknown, out: string[] = []): string[] {
  if (Array.isArray(node)) for (const n of node) refs(n, out)
  else if (node && typeof node === 'object') {
    for (const [k, v] of Object.entries(node)) {
      if (k === '$ref' && typeof v === 'string') out.push(v)
      else refs(v, out)
    }
  }
  return out
}

describe('OpenAPI document', () => {
  test('/docs/json is an OpenAPI 3 document listing every /v1 and /auth route the app has', async () => {
    const { app, req } = await makeTestApp()
    const res = await req('GET', '/docs/json')
    expect(res.status).toBe(200)
    const doc = res.body
    expect(doc.openapi).toMatch(/^3\.\d+\.\d+$/)
    expect(doc.info.title).toBe('License service API')
    expect(typeof doc.info.version).toBe('string')
    expect(doc.servers).toEqual([{ url: '/', description: 'This server' }])
    expect(doc.components.securitySchemes.bearerAuth).toMatchObject({
      type: 'http',
      scheme: 'bearer',
    })

    const api = app.routes.filter((r) => /^\/(v1|auth)\//.test(r.path))
    for (const route of api) {
      const op = doc.paths[toOpenApiPath(route.path)]?.[route.method.toLowerCase()]
      expect(op, `${route.method} ${route.path} is missing from the document`).toBeDefined()
      expect(
        Object.keys(op.responses).length,
        `${route.method} ${route.path} has no responses`,
      ).toBeGreaterThan(0)
      // Every path parameter is declared, as OpenAPI requires.
      for (const name of route.path.match(/:([A-Za-z0-9_]+)/g) ?? []) {
        expect(
          op.parameters?.some(
            (p: { in: string; name: string }) => p.in === 'path' && p.name === name.slice(1),
          ),
          `${route.path} does not declare ${name}`,
        ).toBe(true)
      }
      if (route.path.startsWith('/v1/')) {
        expect(
          op.security,
          `${route.method} ${route.path} is not marked as needing the bearer key`,
        ).toEqual([{ bearerAuth: [] }])
      }
    }
    for (const path of ['/healthz', '/readyz', '/metrics'])
      expect(doc.paths[path]?.get).toBeDefined()
    expect(Object.keys(doc.paths).filter((p) => p.startsWith('/docs'))).toEqual([])

    for (const ref of refs(doc)) {
      const target = ref
        .replace(/^#\//, '')
        .split('/')
        .reduce((node: any, key) => node?.[key], doc)
      expect(target, `dangling ${ref}`).toBeDefined()
    }
  })
})

describe('Swagger UI', () => {
  test('/docs is an HTML page whose every asset is local and served', async () => {
    const { req } = await makeTestApp()
    const page = await req('GET', '/docs')
    expect(page.status).toBe(200)
    expect(page.headers.get('content-type')).toStartWith('text/html')
    const html = page.body as string
    const urls = [...html.matchAll(/\b(?:src|href)="([^"]+)"/g)].map((m) => m[1] as string)
    expect(urls.length).toBeGreaterThanOrEqual(2)
    expect(html).not.toMatch(/https?:\/\//)
    for (const url of urls) {
      expect(url).toStartWith('/')
      const asset = await req('GET', url)
      expect(asset.status, url).toBe(200)
    }
    expect(html).toContain("url: '/docs/json'")
    const bundle = await req('GET', '/docs/assets/swagger-ui-bundle.js')
    expect(bundle.headers.get('content-type')).toContain('javascript')
    expect((bundle.body as string).length).toBeGreaterThan(100_000)
  })

  test('only the listed swagger-ui files are served', async () => {
    const { req } = await makeTestApp()
    for (const name of [
      'package.json',
      '..%2Fpackage.json',
      'index.html',
      'oauth2-redirect.html',
    ]) {
      expect((await req('GET', `/docs/assets/${name}`)).status, name).toBe(404)
    }
  })
})

test('every tag a route uses is described in the document', async () => {
  const { req } = await makeTestApp()
  const doc = (await req('GET', '/docs/json')).body
  const described = new Set(doc.tags.map((t: { name: string }) => t.name))
  for (const [path, ops] of Object.entries(
    doc.paths as Record<string, Record<string, { tags?: string[] }>>,
  )) {
    for (const [method, op] of Object.entries(ops)) {
      expect(op.tags?.length, `${method} ${path} has no tag`).toBeGreaterThan(0)
      for (const tag of op.tags ?? [])
        expect(described.has(tag), `${method} ${path}: tag "${tag}"`).toBe(true)
    }
  }
})

describe('the document describes what requests may hold', () => {
  /** Every schema node under `node`, with the JSON path that leads to it. */
  function* schemas(node: any, at: string): Generator<[string, any]> {
    if (!node || typeof node !== 'object') return
    yield [at, node]
    for (const [key, child] of Object.entries(node.properties ?? {})) yield* schemas(child, `${at}.${key}`)
    for (const child of Object.values(node.patternProperties ?? {})) yield* schemas(child, `${at}{*}`)
    for (const child of node.anyOf ?? []) yield* schemas(child, at)
    if (node.items) yield* schemas(node.items, `${at}[]`)
  }

  test('strict /v1 bodies, tolerant /auth bodies, JSON-integer counts, no NUL or lone surrogate in any string', async () => {
    const { req } = await makeTestApp()
    const { STORABLE_CHAR, STORABLE_TEXT } = await import('../../src/lib/model')
    const { ISO_8601 } = await import('../../src/lib/time')
    const doc = (await req('GET', '/docs/json')).body
    for (const [path, ops] of Object.entries<Record<string, any>>(doc.paths)) {
      for (const [method, op] of Object.entries(ops)) {
        const where = `${method.toUpperCase()} ${path}`
        const body = op.requestBody?.content?.['application/json']?.schema
        const inputs = [...(op.parameters ?? []).map((p: any) => [`${where} ${p.name}`, p.schema]), [`${where} body`, body]]
        for (const [name, schema] of inputs) {
          for (const [at, node] of schemas(schema, name)) {
            if (node.type !== 'string' || node.const !== undefined) continue
            // Elysia's numeric-text alternative of t.Integer: right for a query string, never in a JSON body.
            const numericText = node.format === 'integer' || node.format === 'numeric'
            if (numericText) expect(name.endsWith('body'), `${at} takes a number as text`).toBe(false)
            // Text, Timestamp (digits and separators), or Chars (storable characters, counted).
            else if (node.pattern !== STORABLE_TEXT && node.pattern !== ISO_8601.source) {
              expect(node.pattern, `${at} admits NUL or lone surrogates`).toStartWith(`^${STORABLE_CHAR}{`)
            }
          }
        }
        if (!body) continue
        // A union of bodies (an update's actions, selfban's two modes): each member as a body.
        for (const member of (body.anyOf ?? [body]).filter((m: any) => m.type === 'object')) {
          if (path.startsWith('/v1/') && member.properties) expect(member.additionalProperties, `${where} admits unknown fields`).toBe(false)
          if (path.startsWith('/auth/')) expect(member.additionalProperties, `${where} refuses unknown fields`).toBe(true)
        }
      }
    }
  })
})

test('no schema carries a fragment $id (JSON Schema 2020-12 forbids it), and a numeric query parameter is documented as its number alone', async () => {
  const { req } = await makeTestApp()
  const doc = (await req('GET', '/docs/json')).body
  const ids: string[] = []
  const walk = (node: unknown): void => {
    if (Array.isArray(node)) for (const n of node) walk(n)
    else if (node && typeof node === 'object') {
      for (const [k, v] of Object.entries(node)) {
        if (k === '$id' && typeof v === 'string') ids.push(v)
        else walk(v)
      }
    }
  }
  walk(doc)
  expect(ids.filter((id) => id.includes('#'))).toEqual([])
  const limit = doc.paths['/v1/licenses'].get.parameters.find((p: { name: string }) => p.name === 'limit')
  expect(limit.schema).toEqual({ type: 'integer', minimum: 1, maximum: 200, default: 50 })
})
