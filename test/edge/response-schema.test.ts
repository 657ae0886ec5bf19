import { expect, test } from 'bun:test'
import { Elysia, t as types } from 'elysia'
import { makeTestApp } from '../support/helpers'
import { loggedBy } from '../support/log-capture'

// With Elysia's normalize off (so request bodies are refused, not trimmed), a response is checked, not
// trimmed, against its schema: one carrying a field its schema lacks must fail closed, not leak it.
test('a response with a field its schema lacks is a 500 whose log line names the route, not the value', async () => {
  const t = await makeTestApp()
  t.app.use(
    new Elysia().get('/v1/leaky/:licenseKey', () => ({ ok: true, secret: 'whsec_do-not-show' }), {
      response: { 200: types.Object({ ok: types.Boolean() }) },
    }),
  )
  const entries = await loggedBy(async () => {
    const res = await t.req('GET', '/v1/leaky/K7QM-3XWT-9HFP-2RDN')
    expect(res.status).toBe(500)
    expect(res.body).toEqual({ error: 'internal_error', message: 'Something went wrong on our side' })
  })
  const lines = entries.map((e) => JSON.stringify(e)).join('\n')
  expect(lines).toContain('"route":"/v1/leaky/:licenseKey"')
  expect(lines).not.toContain('whsec_do-not-show')
  expect(lines).not.toContain('K7QM-3XWT-9HFP-2RDN')
})
