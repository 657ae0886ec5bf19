/**
 * A lock another session holds (an operator's, a migration's) costs the service at most its lock wait
 * (2 s): a seat batch fails only the request whose row is locked, the license.validated events wait
 * for the table and are written once it is free, and one account's locked row holds up no other
 * account's credit flush.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { and, eq, inArray } from 'drizzle-orm'
import postgres from 'postgres'
import { accounts, events } from '../../src/db/schema'
import { insertLicense, nonce } from '../support/client'
import { makeTestApp, MODE, TEST_DATABASE_URL } from '../support/helpers'
import { until } from '../support/servers'

// Another session's locks: the embedded database has one session (a describe's body runs even when skipped).
if (MODE === 'postgres') describe('locks held by another session', async () => {
  const t = await makeTestApp({ env: { PUBLIC_RATE_LIMITS: 'false' } })
  const other = postgres(TEST_DATABASE_URL!, { max: 1, onnotice: () => {} })
  afterAll(() => other.end({ timeout: 1 }))
  const validate = (s: { appId: string; appSecret: string }, licenseKey: string, hwid: string) =>
    t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid, nonce: nonce() } })
  /** Holds what `lock` takes in a transaction of `other` for `ms`; resolves once it is held, with the transaction's end. */
  const holding = async (lock: (tx: postgres.TransactionSql) => Promise<unknown>, ms: number) => {
    const { promise: held, resolve } = Promise.withResolvers<void>()
    const done = other.begin(async (tx) => {
      await lock(tx)
      resolve()
      await tx`SELECT pg_sleep(${ms / 1000})`
    })
    await held
    // Wrapped: an async function's result that is a promise is waited for.
    return { done }
  }

  test("a license row locked elsewhere fails only its own first login, within the lock wait; the app's other logins bind", async () => {
    const s = await t.seed()
    const locked = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 3 })
    const free = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 3 })
    const { done } = await holding((tx) => tx`SELECT 1 FROM licenses WHERE key = ${locked} FOR UPDATE`, 6_000)
    const logins = Promise.all([validate(s, locked, 'device-a'), validate(s, free, 'device-a')])
    // Answered while the lock is still held (its 2 s wait, not the holder's 6 s): a bound on the time
    // itself failed on a busy host by milliseconds.
    expect(await Promise.race([logins.then(() => 'answered'), done.then(() => 'the lock was let go first')])).toBe('answered')
    const [onLocked, onFree] = await logins
    expect(onLocked.body).toEqual({ status: 'failed', error: 'system_error' })
    expect(onFree.status, JSON.stringify(onFree.body)).toBe(200)
    await done
    expect((await validate(s, locked, 'device-a')).status).toBe(200)
  })

  test('license.validated events that meet the events table locked are kept and written once it is free, none dropped', async () => {
    const seeds = [await t.seed(), await t.seed()]
    const keys: string[] = []
    for (const s of seeds) {
      await t.req('POST', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey, body: { url: 'https://203.0.113.1/hook', events: ['license.validated'] } })
      keys.push(await insertLicense(t.ctx, s.appId, { hwids: ['device'] }))
    }
    const dropped = t.ctx.metrics.validatedEventsDropped.value('refused')
    // What a non-concurrent CREATE INDEX takes during an upgrade.
    const { done } = await holding((tx) => tx`LOCK TABLE events IN SHARE MODE`, 3_000)
    for (const [i, s] of seeds.entries()) expect((await validate(s, keys[i]!, 'device')).status).toBe(200)
    await done
    const written = () =>
      t.ctx.database.db.select().from(events).where(and(inArray(events.appId, seeds.map((s) => s.appId)), eq(events.event, 'license.validated')))
    expect((await until(written, (rows) => rows.length === 2, 15_000)).length).toBe(2)
    expect(t.ctx.metrics.validatedEventsDropped.value('refused')).toBe(dropped)
  })

  test("an account row locked elsewhere holds up no other account's credit flush", async () => {
    const [locked, ...others] = [await t.seed({ credits: 100 }), await t.seed({ credits: 100 }), await t.seed({ credits: 100 })]
    for (const s of [locked!, ...others]) expect((await validate(s, await insertLicense(t.ctx, s.appId, { hwids: ['device'] }), 'device')).status).toBe(200)
    const { done } = await holding((tx) => tx`SELECT 1 FROM accounts WHERE id = ${locked!.accountId} FOR UPDATE`, 6_000)
    const started = performance.now()
    await t.ctx.credits.flush()
    expect(performance.now() - started).toBeLessThan(4_500)
    const credits = async (accountId: string) => (await t.ctx.database.db.select({ c: accounts.credits }).from(accounts).where(eq(accounts.id, accountId)))[0]?.c
    for (const s of others) expect(await credits(s.accountId)).toBe(99)
    await done
    await t.ctx.credits.flush()
    expect(await credits(locked!.accountId)).toBe(99)
  })
})
