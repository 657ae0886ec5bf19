import { dirname, join } from 'node:path'
import { swagger } from '@elysiajs/swagger'
import { Elysia } from 'elysia'
import pkg from '../../package.json'
import type { Context } from '../context'

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
    window.ui = SwaggerUIBundle({ url: '/docs/json', dom_id: '#swagger-ui', deepLinking: true, persistAuthorization: true })
  </script>
</body>
</html>
`

const DESCRIPTION = `Self-hosted license-key service speaking the AuthForge wire protocol.

**Developer API** (\`/v1/*\`): server-to-server JSON. Every request carries \`Authorization: Bearer svc_live_…\`
(keys come from the operator CLI, \`bun run cli account create\`). Errors are \`{ "error": code, "message": text }\`:
400 \`bad_request\`, 401 \`invalid_api_key\`, 402 \`no_credits\`, 403 \`forbidden\`, 404 \`not_found\`,
413 \`bad_request\` (body over 1 MiB), 429 \`rate_limited\`, 500 \`internal_error\`.
Bodies are strict: exactly the documented fields (an unknown one is a 400 naming it), counts as JSON integers, no
\`null\`, array or empty body where an object is expected. No string may hold a NUL character or an unpaired UTF-16
surrogate (the \`pattern\` of every string field). Nothing changes on a 4xx.
Rate limit: per API key, a burst of 100 requests refilling at 50 per second. Every authenticated response
carries \`RateLimit-Limit\`, \`RateLimit-Remaining\` and \`RateLimit-Reset\`; a 429 also carries \`Retry-After\`
(seconds). Retry with exponential backoff.

**Client endpoints** (\`/auth/*\`): called by the client SDKs with \`appId\` + \`appSecret\` (pre-session) or a
\`sessionToken\` (post-session). Failures are \`{ "status": "failed", "error": code }\`; unknown body fields are
ignored, a mistyped known field is 400 \`bad_request\`. Success responses of
validate and heartbeat are signed: verify the Ed25519 \`signature\` over the base64 \`payload\` string as received
with the app's public key, then decode the payload.`

/** The OpenAPI document at /docs/json (built by @elysiajs/swagger from every route's schema) and Swagger UI at /docs. */
export const docsRoutes = (_deps: Context) =>
  new Elysia({ name: 'routes-docs' })
    .use(
      swagger({
        path: '/docs',
        specPath: '/docs/json',
        provider: 'swagger-ui',
        exclude: [/^\/docs/],
        documentation: {
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
