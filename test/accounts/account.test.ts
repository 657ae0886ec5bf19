import { beforeAll, describe, expect, test } from 'bun:test'
import { createApiKey } from '../../src/accounts/service'
import { makeTestApp, type TestApp } from '../support/helpers'

let t: TestApp
beforeAll(async () => {
  t = await makeTestApp()
})

describe('GET /v1/account', () => {
  test("returns the key's account with its balance", async () => {
    const s = await t.seed({ credits: 42, name: 'Acme' })
    const res = await t.req('GET', '/v1/account', { apiKey: s.apiKey })
    expect(res.status).toBe(200)
    expect(res.body).toEqual({ accountId: s.accountId, name: 'Acme', credits: 42 })
  })

  test('a second key of the account sees the same account', async () => {
    const s = await t.seed()
    const second = await createApiKey(t.ctx, s.accountId)
    const res = await t.req('GET', '/v1/account', { apiKey: second })
    expect(res.body.accountId).toBe(s.accountId)
  })
})
