/**
 * A change whose COMMIT's answer is lost with its connection is answered as PostgreSQL says it ended:
 * the seat binder's batches and every AppActor.write, through a proxy that drops the answer.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { and, eq, sql } from 'drizzle-orm'
import { addCredits, createAccount, revokeApiKey } from '../../src/accounts/service'
import { createApplication } from '../../src/apps/service'
import { type Database, openDb } from '../../src/db/client'
import { sha256Hex } from '../../src/lib/crypto'
import { events, licenses } from '../../src/db/schema'
import { insertLicense, nonce } from '../support/client'
import { makeTestApp, MODE, TEST_DATABASE_URL } from '../support/helpers'
import { postgresBehindProxy } from '../support/tampering-proxy'

// PostgreSQL mode only: the embedded database has no connection to lose (a describe's body runs even when skipped).
if (MODE === 'postgres') describe('a change whose COMMIT answer is lost', async () => {
  const { proxy, url } = await postgresBehindProxy(TEST_DATABASE_URL!)
  const database = await openDb({ databaseUrl: url, dataDir: null, poolSize: 2 })
  afterAll(async () => {
    await database.close()
    proxy.close()
  })
  /**
   * postgres.js sends COMMIT as a prepared statement: parsed with its text once per connection, then
   * bound by name with no parameters (after the name: no format codes, no values), which no other
   * statement of these transactions is (BEGIN and the transaction id's read are simple queries).
   */
  const isCommit = (text: string) => text.includes('\0commit\0') || /^B[\s\S]{4}\0[^\0]+\0\0\0\0\0/.test(text)
  /**
   * Loses the answer to the first COMMIT after a write naming `marker`. With `beforeCommit`, the answer
   * to the record of the change's invalidation (the last statement of every AppActor change and seat
   * batch) instead: the connection goes before the COMMIT is sent, and the transaction aborts.
   */
  const loseCommitOf = (marker: string, beforeCommit = false) => {
    let named = false
    proxy.loseReplyTo = (data) => {
      const text = data.toString('latin1')
      named ||= text.includes(marker)
      return named && (beforeCommit ? text.includes('cache_invalidations') : isCommit(text))
    }
  }
  const t = await makeTestApp({ database, env: { PUBLIC_RATE_LIMITS: 'false' } })

  const balance = async (apiKey: string) => (await t.req('GET', '/v1/account', { apiKey })).body.credits as number
  const hwidEvents = async (licenseKey: string) =>
    (await t.ctx.database.db.select({ event: events.event, data: events.data }).from(events)).filter(
      (e) => e.event === 'license.hwid_bound' && (e.data as { licenseKey: string }).licenseKey === licenseKey,
    )
  const boundHwids = async (licenseKey: string) =>
    (await t.ctx.database.db.select({ hwids: licenses.hwids }).from(licenses).where(eq(licenses.key, licenseKey)))[0]?.hwids

  test.each([
    ['committed: the login succeeds, charged, its device bound once', false],
    ['cut before its COMMIT: the login fails with its charge refunded, nothing bound', true],
  ])('a first login whose seat batch was %s', async (_name, beforeCommit) => {
    const s = await t.seed({ credits: 10 })
    const licenseKey = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 1 })
    const hwid = `hwid-lost-commit-${crypto.randomUUID()}`
    loseCommitOf(hwid, beforeCommit)
    const res = await t.req('POST', '/auth/validate', {
      body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid, nonce: nonce() },
    })
    expect(proxy.loseReplyTo).toBeNull()
    if (beforeCommit) {
      expect(res.body).toEqual({ status: 'failed', error: 'system_error' })
      expect(await boundHwids(licenseKey)).toEqual([])
      expect(await hwidEvents(licenseKey)).toHaveLength(0)
      expect(await balance(s.apiKey)).toBe(10)
    } else {
      expect(res.status, JSON.stringify(res.body)).toBe(200)
      expect(await boundHwids(licenseKey)).toEqual([hwid])
      expect(await hwidEvents(licenseKey)).toHaveLength(1)
      expect(await balance(s.apiKey)).toBe(9)
    }
    // Another device finds the seat as the answer said.
    const other = await t.req('POST', '/auth/validate', {
      body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: 'another-device', nonce: nonce() },
    })
    expect(other.status).toBe(beforeCommit ? 200 : 403)
  })

  test('a revoke that committed is answered 200, and the license is refused from then on', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId)
    loseCommitOf(licenseKey)
    const res = await t.req('PUT', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey, body: { action: 'revoke' } })
    expect(proxy.loseReplyTo).toBeNull()
    expect(res.status, JSON.stringify(res.body)).toBe(200)
    expect(res.body.license.status).toBe('revoked')
    const [row] = await t.ctx.database.db
      .select({ status: licenses.status })
      .from(licenses)
      .where(and(eq(licenses.key, licenseKey), eq(licenses.appId, s.appId)))
    expect(row?.status).toBe('revoked')
    const validate = await t.req('POST', '/auth/validate', {
      body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: 'a-device', nonce: nonce() },
    })
    expect(validate.body).toEqual({ status: 'failed', error: 'revoked' })
  })

  test('a lost COMMIT asked about on a server started since (a crash, a failover) is answered as failed: its id may be another transaction\'s', async () => {
    const restarted: Database = {
      ...database,
      aside: (questions) => database.aside((ask) => questions(async (text, params) => (await ask(text, params)).map((row) => ({ ...row, started: 'since' })))),
    }
    const other = await makeTestApp({ database: restarted, env: { PUBLIC_RATE_LIMITS: 'false' } })
    const s = await other.seed()
    const licenseKey = await insertLicense(other.ctx, s.appId)
    loseCommitOf(licenseKey)
    const res = await other.req('PUT', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey, body: { action: 'revoke' } })
    expect(proxy.loseReplyTo).toBeNull()
    expect(res.status).toBe(500)
  })

  test('a revoke whose COMMIT answer is lost while the request pool is busy is answered 200: the question does not queue behind it', async () => {
    const s = await t.seed()
    const licenseKey = await insertLicense(t.ctx, s.appId)
    const busy: Promise<unknown>[] = []
    let named = false
    proxy.loseReplyTo = (data) => {
      const text = data.toString('latin1')
      named ||= text.includes(licenseKey)
      if (!named || !isCommit(text)) return false
      // The pool's two connections and a query queued behind them, for longer than the question may wait (2 s).
      for (let i = 0; i < 3; i++) busy.push(database.db.execute(sql`SELECT pg_sleep(3)`).then(() => {}))
      return true
    }
    const res = await t.req('PUT', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey, body: { action: 'revoke' } })
    expect(proxy.loseReplyTo).toBeNull()
    expect(res.status, JSON.stringify(res.body)).toBe(200)
    expect(res.body.license.status).toBe('revoked')
    await Promise.all(busy)
  })

  test('credits added, an account and an app created, an API key revoked whose COMMIT answers were lost are answered as done, once', async () => {
    const s = await t.seed({ credits: 10 })
    loseCommitOf(s.accountId)
    expect(await addCredits(t.ctx, s.accountId, 5)).toEqual({ accountId: s.accountId, credits: 15 })
    expect(proxy.loseReplyTo).toBeNull()

    const name = `lost-commit-${crypto.randomUUID()}`
    loseCommitOf(name)
    const account = await createAccount(t.ctx, name, 3)
    expect(proxy.loseReplyTo).toBeNull()
    expect((await t.req('GET', '/v1/account', { apiKey: account.apiKey })).body).toMatchObject({ credits: 3 })

    loseCommitOf(name)
    const app = await createApplication(t.ctx, account.accountId, name, false)
    expect(proxy.loseReplyTo).toBeNull()
    const apps = (await t.req('GET', '/v1/apps', { apiKey: account.apiKey })).body.apps
    expect(apps.map((a: { appId: string }) => a.appId)).toEqual([app.appId])

    loseCommitOf(sha256Hex(account.apiKey))
    expect(await revokeApiKey(t.ctx, account.apiKey)).toBe(true)
    expect(proxy.loseReplyTo).toBeNull()
    expect((await t.req('GET', '/v1/account', { apiKey: account.apiKey })).status).toBe(401)
  })
})
