import { expect, test } from 'bun:test'
import { makeTestApp } from './support/helpers'

test('healthz answers and unknown routes get a JSON 404', async () => {
  const { req } = await makeTestApp()
  expect((await req('GET', '/healthz')).status).toBe(200)
  const missing = await req('GET', '/nope')
  expect(missing.status).toBe(404)
  expect(missing.body).toEqual({ error: 'not_found', message: 'No such route' })
})

test('seed provisions an account and an app', async () => {
  const { seed } = await makeTestApp()
  const s = await seed()
  expect(s.apiKey).toMatch(/^svc_live_/)
  expect(s.appId).toMatch(/^[0-9a-f-]{36}$/)
  expect(Buffer.from(s.publicKey, 'base64')).toHaveLength(32)
})
