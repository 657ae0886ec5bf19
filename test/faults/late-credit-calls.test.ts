/**
 * A Redis that stops reading (the connection stays open) while a balance load or a credit flush holds
 * the account's row: the call goes past its deadline and the transaction gives the row up (embedded,
 * the whole database: PGlite runs one transaction at a time). Redis may still run the call later; what
 * it does then must count no credit twice.
 */
import { expect, test } from 'bun:test'
import { eq } from 'drizzle-orm'
import { CreditLedger } from '../../src/credits/ledger'
import { accounts } from '../../src/db/schema'
import { RedisStore } from '../../src/store/redis'
import { hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp } from '../support/helpers'
import { until } from '../support/servers'
import { storeBehindProxy } from '../support/tampering-proxy'

const { proxy, store, redisUrl } = await storeBehindProxy({ callTimeoutMs: 1000 })
const t = await makeTestApp({ store })

/** An account with 10 credits in PostgreSQL and `charged` of them taken by validates, not flushed yet. */
async function charged(n: number) {
  const s = await t.seed({ credits: 10 })
  const licenseKey = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
  for (let i = 0; i < n; i++) {
    const res = await t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() } })
    expect(res.status, JSON.stringify(res.body)).toBe(200)
  }
  return s
}

const reconciled = async (accountId: string) =>
  (await t.ctx.database.db.select({ credits: accounts.credits }).from(accounts).where(eq(accounts.id, accountId)))[0]?.credits

/**
 * Runs `caller` with Redis holding back the writes from the moment the store's `method` is called; once
 * the caller gave up, checks the account's row is free (Redis still holds the call) and answers how
 * long that took and the function that lets Redis read again.
 */
async function stalledAt(method: 'loadBalance' | 'beginFlush', accountId: string, caller: () => Promise<unknown>) {
  const call = store[method].bind(store) as (...args: unknown[]) => Promise<never>
  let release = () => {}
  store[method] = (async (...args: unknown[]) => {
    store[method] = call as never
    release = proxy.holdWrites()
    return call(...args)
  }) as never
  const startedAt = performance.now()
  await caller().catch(() => {})
  const tookMs = performance.now() - startedAt
  const [row] = await t.ctx.database.db.transaction((tx) =>
    tx.select({ credits: accounts.credits }).from(accounts).where(eq(accounts.id, accountId)).for('update', { noWait: true }),
  )
  expect(row?.credits).toBe(10)
  return { tookMs, release }
}

test('a balance load gives the row up by its deadline, and run late, after a flush moved charges, loads nothing', async () => {
  const s = await charged(1)
  // No live balance: the next charge or read of it seeds one, reading PostgreSQL's 10 FOR SHARE.
  await store.creditsChanging(s.accountId)
  const { tookMs, release } = await stalledAt('loadBalance', s.accountId, () => t.ctx.credits.loadLiveBalance(s.accountId))
  expect(tookMs).toBeLessThan(2500)
  // Another instance, whose connection Redis still reads, moves the pending charge: PostgreSQL holds 9.
  const other = new RedisStore(redisUrl)
  try {
    await new CreditLedger({ database: t.ctx.database, store: other }).flush()
    expect(await reconciled(s.accountId)).toBe(9)
    // Now Redis runs the load: with the 10 read before that flush it would seed 10.
    release()
    await until(() => store.ping(), (up) => up, 5000)
    expect(await other.balance(s.accountId)).toBeNull()
  } finally {
    await other.close()
  }
  expect((await t.req('GET', '/v1/account', { apiKey: s.apiKey })).body.credits).toBe(9)
})

test('a flush gives the row up by its deadline, and the begin Redis runs late is applied once', async () => {
  const s = await charged(2)
  const { tookMs, release } = await stalledAt('beginFlush', s.accountId, () => t.ctx.credits.flush())
  expect(tookMs).toBeLessThan(2500)
  release()
  await until(() => store.ping(), (up) => up, 5000)
  // The begin left a flush record under its id; the next pass applies it, and the one after finds nothing.
  await t.ctx.credits.flush()
  expect(await reconciled(s.accountId)).toBe(8)
  await t.ctx.credits.flush()
  expect(await reconciled(s.accountId)).toBe(8)
  expect((await t.req('GET', '/v1/account', { apiKey: s.apiKey })).body.credits).toBe(8)
})
