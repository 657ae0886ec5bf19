import { dirname, join } from 'node:path'
import { swagger } from '@elysiajs/swagger'
import { Elysia } from 'elysia'
import pkg from '../../package.json'
import type { Context } from '../context'
import { ALSO_SERVES, PUBLIC_RETRY_AFTER, RESPONSE_HEADERS, SHARED_HEADERS } from './openapi'

// Swagger UI's files come from the installed package, so /docs renders with no internet access.
const SWAGGER_UI_DIR = dirname(Bun.resolveSync('swagger-ui-dist/package.json', import.meta.dir))
/** The only files /docs/assets serves: what the page below loads (maps for browser dev tools). */
const ASSETS = new Set([
  'swagger-ui.css',
  'swagger-ui.css.map',
  'swagger-ui-bundle.js',
  'swagger-ui-bundle.js.map',
  'favicon-32x32.png',
  'favicon-16x16.png',
])

// validatorUrl: null, or the page would fetch a validity badge from validator.swagger.io.
const PAGE = `<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>License service API</title>
  <link rel="icon" type="image/png" href="/docs/assets/favicon-32x32.png" sizes="32x32">
  <link rel="stylesheet" href="/docs/assets/swagger-ui.css">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="/docs/assets/swagger-ui-bundle.js"></script>
  <script>
    window.ui = SwaggerUIBundle({ url: '/docs/json', dom_id: '#swagger-ui', deepLinking: true, persistAuthorization: true, validatorUrl: null })
  </script>
</body>
</html>
`

const DESCRIPTION = `Self-hosted license-key service speaking the AuthForge wire protocol.

**Developer API** (\`/v1/*\`): server-to-server JSON. Every request carries \`Authorization: Bearer svc_live_…\`
(keys come from the operator CLI, \`bun run cli account create\`). Errors are \`{ "error": code, "message": text }\`:
400 \`bad_request\`, 401 \`invalid_api_key\`, 402 \`no_credits\`, 403 \`forbidden\`, 404 \`not_found\`,
408 \`bad_request\` (body not all there within 20 s), 413 \`bad_request\` (body over 1 MiB), 429 \`rate_limited\`, 500 \`internal_error\`.
Bodies are strict: exactly the documented fields (an unknown one is a 400 naming it), counts as JSON integers, no
\`null\`, array or empty body where an object is expected, bytes that are not UTF-8. No string may hold a NUL character or an unpaired UTF-16
surrogate (the \`pattern\` of every string field). Nothing changes on a 4xx.
Rate limit: per API key, a burst of 100 requests refilling at 50 per second. Responses past the key check
carry \`RateLimit-Limit\`, \`RateLimit-Remaining\` and \`RateLimit-Reset\` (a 408 or 413, refused while the body is
read, and a 500 do not); a 429 also carries \`Retry-After\` (seconds). Retry with exponential backoff.

Every response carries \`X-Request-Id\`: the request's own when it sent a sane one, else a new one, as the logs name it.

**Client endpoints** (\`/auth/*\`): called by the client SDKs with \`appId\` + \`appSecret\` (pre-session) or a
\`sessionToken\` (post-session). Failures are \`{ "status": "failed", "error": code }\`; unknown body fields are
ignored, a mistyped known field is 400 \`bad_request\`. Success responses of
validate and heartbeat are signed: verify the Ed25519 \`signature\` over the base64 \`payload\` string as received
with the app's public key, then decode the payload.`

type Json = Record<string, any>

/** The fields of a Response Object; the generator lifts every other keyword of a response schema into it. */
const RESPONSE_FIELDS = new Set(['description', 'headers', 'content', 'links'])

/** Where a schema nests schemas: the walk below visits every one. */
const SUBSCHEMA_LISTS = ['anyOf', 'oneOf', 'allOf', 'prefixItems'] as const
const SUBSCHEMA_MAPS = ['properties', 'patternProperties', '$defs'] as const
const SUBSCHEMA_ONE = ['items', 'additionalProperties', 'not', 'contentSchema'] as const

/**
 * Drops OpenAPI 3.0's `nullable` (Elysia's t.Nullable writes it): 3.1 says null in the type union, as the
 * anyOf beside it does. And an `$id` that is a fragment (Elysia names a model `#/components/schemas/…`),
 * which JSON Schema 2020-12 forbids: validators refuse the document.
 */
function toJsonSchema(schema: unknown): void {
  if (!schema || typeof schema !== 'object') return
  const node = schema as Json
  delete node.nullable
  if (typeof node.$id === 'string' && node.$id.startsWith('#')) delete node.$id
  for (const key of SUBSCHEMA_LISTS) for (const child of node[key] ?? []) toJsonSchema(child)
  for (const key of SUBSCHEMA_MAPS) for (const child of Object.values(node[key] ?? {})) toJsonSchema(child)
  for (const key of SUBSCHEMA_ONE) toJsonSchema(node[key])
}

/**
 * A query parameter's number as its value: Elysia's numeric query schemas add a member for the text
 * ("10") they convert, with a default of 0 of its own, which a generated client would take for the
 * parameter's.
 */
function numberParameter(schema: Json): Json {
  const members = (schema.anyOf ?? []) as Json[]
  const number = members.find((s) => s.type === 'integer' || s.type === 'number')
  const text = members.find((s) => s.type === 'string' && (s.format === 'integer' || s.format === 'numeric'))
  if (!number || !text || members.length !== 2) return schema
  const { anyOf: _members, ...rest } = schema
  return { ...rest, ...number }
}

/** The member of a body schema that a text/plain body (read as a string by app.ts) can match, if any. */
const textMember = (schema: Json): Json | undefined =>
  schema.type === 'string' ? schema : (schema.anyOf as Json[] | undefined)?.find((s) => s.type === 'string')

const shared = (name: keyof typeof SHARED_HEADERS) => ({ $ref: `#/components/headers/${name}` })
const RATE_LIMIT_HEADERS = ['RateLimit-Limit', 'RateLimit-Remaining', 'RateLimit-Reset'] as const
/**
 * A Developer API route's statuses sent without the limiter's headers: 408 and 413 are refused while the
 * body is read, before the key is looked at; a 500 is written afresh, with none of the request's headers.
 */
const WITHOUT_RATE_LIMIT = new Set(['408', '413', '500'])

/** The headers a response carries, as the server sends them (request-id.ts, rate-limit.ts, client-auth/policy.ts). */
function responseHeaders(operation: Json, status: string): Json {
  const keyed = (operation.security ?? []).some((requirement: Json) => 'bearerAuth' in requirement)
  const rateLimited = keyed && !WITHOUT_RATE_LIMIT.has(status)
  return {
    'X-Request-Id': shared('X-Request-Id'),
    ...(rateLimited ? Object.fromEntries(RATE_LIMIT_HEADERS.map((name) => [name, shared(name)])) : {}),
    ...(status === '429' ? { 'Retry-After': keyed ? shared('Retry-After') : PUBLIC_RETRY_AFTER } : {}),
    ...operation[RESPONSE_HEADERS]?.[status],
  }
}

/**
 * @elysiajs/swagger 1.3 writes a 3.0-shaped document around 3.1 (JSON Schema 2020-12) schemas. This puts
 * the route schemas' own keywords back where OpenAPI 3.1 reads them and lists the media types the server
 * really speaks, so the document stays generated from the same TypeBox schemas that validate:
 * - request bodies: JSON (app.ts parses every body as JSON, whatever its Content-Type), plus text/plain on
 *   a /v1 route whose body admits a string (the only Content-Type app.ts reads as text);
 * - responses: JSON (the generator repeats them under the request's types) and what the route declares
 *   in ALSO_SERVES, with the schema keywords the generator lifted into the Response Object (examples, a
 *   title) returned to the schema;
 * - response headers, which route schemas cannot declare: those every response or every Developer API
 *   response carries (`components.headers`) and what the route declares in RESPONSE_HEADERS;
 * - parameters: the `examples` the generator lifted out of the schema returned to it, a number as a number;
 * - schemas: no 3.0 `nullable`, no fragment `$id`.
 */
function asOpenApi31(generated: Json): Json {
  const doc: Json = JSON.parse(JSON.stringify(generated))
  for (const [path, item] of Object.entries<Json>(doc.paths ?? {})) {
    for (const operation of Object.values<Json>(item)) {
      for (const parameter of operation.parameters ?? []) {
        if (parameter.examples !== undefined) parameter.schema = { ...parameter.schema, examples: parameter.examples }
        delete parameter.examples
        parameter.schema = numberParameter(parameter.schema)
        toJsonSchema(parameter.schema)
      }
      const body = operation.requestBody?.content?.['application/json']?.schema
      if (body) {
        toJsonSchema(body)
        const text = path.startsWith('/v1/') ? textMember(body) : undefined
        operation.requestBody.content = {
          'application/json': { schema: body },
          ...(text ? { 'text/plain': { schema: text } } : {}),
        }
      }
      for (const [status, response] of Object.entries<Json>(operation.responses ?? {})) {
        const schema = response.content?.['application/json']?.schema
        const lifted = Object.entries(response).filter(([key]) => !RESPONSE_FIELDS.has(key))
        const fixed: Json = { description: response.description }
        if (schema) {
          const restored = { ...Object.fromEntries(lifted), ...schema }
          toJsonSchema(restored)
          fixed.content = { 'application/json': { schema: restored }, ...operation[ALSO_SERVES]?.[status] }
        } else if (response.content) fixed.content = response.content
        fixed.headers = { ...response.headers, ...responseHeaders(operation, status) }
        operation.responses[status] = fixed
      }
      delete operation[ALSO_SERVES]
      delete operation[RESPONSE_HEADERS]
    }
  }
  doc.components = { ...doc.components, headers: SHARED_HEADERS }
  for (const schema of Object.values(doc.components?.schemas ?? {})) toJsonSchema(schema)
  return doc
}

const SPEC_PATH = '/docs/json'

/** The OpenAPI document at /docs/json (built by @elysiajs/swagger from every route's schema) and Swagger UI at /docs. */
export const docsRoutes = (_deps: Context) =>
  new Elysia({ name: 'routes-docs' })
    // Applies to the plugin's own routes, registered below: only its document is rewritten.
    .onAfterHandle(({ path, response }) => (path === SPEC_PATH ? asOpenApi31(response as Json) : undefined))
    .use(
      swagger({
        path: '/docs',
        specPath: SPEC_PATH,
        provider: 'swagger-ui',
        exclude: [/^\/docs/],
        documentation: {
          // The plugin writes 3.0.3 whatever its schemas are; the document is 3.1 once asOpenApi31 ran.
          openapi: '3.1.0',
          info: { title: 'License service API', version: pkg.version, description: DESCRIPTION },
          servers: [{ url: '/', description: 'This server' }],
          tags: [
            {
              name: 'Licenses',
              description:
                'Issue, list, revoke, re-activate, extend, reset and delete license keys.',
            },
            {
              name: 'Offline licenses',
              description: 'Signed AuthForge `.authforge` files the SDKs verify with no network; mint and list.',
            },
            { name: 'Account', description: 'The account the API key belongs to and its credits.' },
            {
              name: 'Apps',
              description: 'Applications and their Ed25519 signing keys (rotation).',
            },
            {
              name: 'Variables',
              description: 'App and license variable maps, delivered in the signed payload.',
            },
            { name: 'Security', description: 'Per-app HWID and IP blacklists and whitelists.' },
            { name: 'Webhooks', description: 'Signed HTTPS deliveries of license events.' },
            {
              name: 'Client authentication',
              description:
                'Public endpoints the client SDKs call: validate, heartbeat, selfban. No bearer key.',
            },
            { name: 'Operations', description: 'Health, readiness and Prometheus metrics.' },
          ],
          components: {
            securitySchemes: {
              bearerAuth: {
                type: 'http',
                scheme: 'bearer',
                bearerFormat: 'svc_live_…',
                description: 'An API key from the operator CLI, shaped svc_live_<opaque>.',
              },
            },
          },
        },
      }),
    )
    // Registered after the plugin on purpose: this page replaces the plugin's, which loads its script from a CDN.
    .get(
      '/docs',
      () => new Response(PAGE, { headers: { 'content-type': 'text/html; charset=utf-8' } }),
      {
        detail: { hide: true },
      },
    )
    .get(
      '/docs/assets/:file',
      ({ params, status }) => {
        if (!ASSETS.has(params.file))
          return status(404, { error: 'not_found', message: 'No such asset' })
        return new Response(Bun.file(join(SWAGGER_UI_DIR, params.file)), {
          headers: { 'cache-control': 'public, max-age=86400' },
        })
      },
      { detail: { hide: true } },
    )
