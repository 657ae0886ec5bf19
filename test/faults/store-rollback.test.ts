/**
 * Redis comes back with an older copy of its data: an append-only file that lost its last second, a
 * replica promoted before it had every write. Its credit keys are then older than PostgreSQL: charges a
 * flush already moved are pending there again, and a balance an addition of credits dropped is back.
 * PostgreSQL records the store's credit sequence number with each change, so the next flush pass finds
 * the store behind, drops what it holds of the account's credits, and the balance is seeded again.
 */
import { afterAll, expect, test } from 'bun:test'
import { eq } from 'drizzle-orm'
import { addCredits } from '../../src/accounts/service'
import { accounts } from '../../src/db/schema'
import { RedisStore } from '../../src/store/redis'
import { hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp } from '../support/helpers'
import { ownRedis, until } from '../support/servers'

// SAVE writes the copy; a restart (SIGKILL, nothing else saved) comes back with it.
const redis = await ownRedis(['--save', '', '--appendonly', 'no'])
const store = new RedisStore(redis.url)
afterAll(async () => {
  await store.close()
  await redis.stop()
})
const t = await makeTestApp({ store, env: { PUBLIC_RATE_LIMITS: 'false' } })

async function account(credits: number) {
  const s = await t.seed({ credits })
  const licenseKey = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
  return {
    s,
    validate: () => t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() } }),
    reconciled: async () => (await t.ctx.database.db.select({ credits: accounts.credits }).from(accounts).where(eq(accounts.id, s.accountId)))[0]?.credits,
    live: async () => (await t.req('GET', '/v1/account', { apiKey: s.apiKey })).body.credits,
  }
}

async function backFromTheCopy() {
  await redis.stop()
  await redis.start()
  await until(() => store.ping(), (up) => up)
}

test('charges a flush moved after the copy are not moved again', async () => {
  const { validate, reconciled, live } = await account(100)
  for (let i = 0; i < 30; i++) expect((await validate()).status).toBe(200)
  await store.redis.save()
  await t.ctx.credits.flush()
  expect(await reconciled()).toBe(70)

  await backFromTheCopy()
  await t.ctx.credits.flush()
  expect(await reconciled()).toBe(70)
  expect((await validate()).status).toBe(200)
  expect(await live()).toBe(69)
  await t.ctx.credits.flush()
  expect(await reconciled()).toBe(69)
})

test('credits added after the copy can be spent', async () => {
  const { s, validate, reconciled, live } = await account(1)
  expect((await validate()).status).toBe(200)
  await t.ctx.credits.flush()
  await store.redis.save()
  expect((await addCredits(t.ctx, s.accountId, 1000)).credits).toBe(1000)

  await backFromTheCopy()
  // The account's balance is read from PostgreSQL while the store is behind, and licenses can be created.
  expect(await live()).toBe(1000)
  const created = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId } })
  expect(created.status, JSON.stringify(created.body)).toBe(201)
  // The copy's balance of 0 refuses the account, which marks it for the next flush pass.
  expect((await validate()).body).toEqual({ status: 'failed', error: 'no_credits' })
  await t.ctx.credits.flush()
  expect((await validate()).status).toBe(200)
  expect(await live()).toBe(999)
  expect(await reconciled()).toBe(1000)
})
