import { expect, test } from 'bun:test'
import { makeTestApp } from '../support/helpers'

// Elysia reads every hook's and handler's source to decide what to build per request; one global hook
// that hands the whole context to a function makes every route, /auth's included, parse the headers,
// query, cookies and body into objects on every request, used or not.
test('global hooks leave headers, query, cookies and the body unparsed unless a route reads them', async () => {
  const t = await makeTestApp()
  const inference = (t.app as unknown as { inference: Record<string, boolean> }).inference
  expect(inference).toMatchObject({ headers: false, query: false, cookie: false, body: false })
})
