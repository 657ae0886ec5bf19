import { beforeAll, describe, expect, test } from 'bun:test'
import { createApiKey } from '../../src/accounts/service'
import { OperatorError, runCommand } from '../../src/operator/commands'
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

describe('account credits (operator)', () => {
  test('an add that would take the balance past the largest whole number a client reads exactly is refused, and adds nothing', async () => {
    const s = await t.seed({ credits: 100 })
    const add = (n: number) => runCommand(t.ctx, { kind: 'account credits', accountId: s.accountId, add: n })
    await expect(add(Number.MAX_SAFE_INTEGER)).rejects.toThrow(OperatorError)
    await expect(add(Number.MAX_SAFE_INTEGER)).rejects.toThrow(/9007199254740991/)
    expect((await t.req('GET', '/v1/account', { apiKey: s.apiKey })).body.credits).toBe(100)
    // Up to it exactly is fine, and so is taking away from there.
    expect(await add(Number.MAX_SAFE_INTEGER - 100)).toEqual({ accountId: s.accountId, credits: Number.MAX_SAFE_INTEGER })
    expect(await add(-1)).toEqual({ accountId: s.accountId, credits: Number.MAX_SAFE_INTEGER - 1 })
    await expect(add(2)).rejects.toThrow(OperatorError)
  })

  test('an add to an account that does not exist is refused as such', async () => {
    await expect(runCommand(t.ctx, { kind: 'account credits', accountId: crypto.randomUUID(), add: 1 })).rejects.toThrow(/No account/)
  })
})
