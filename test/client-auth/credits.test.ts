import { describe, expect, test } from 'bun:test'
import { randomUUID } from 'node:crypto'
import { and, eq, inArray } from 'drizzle-orm'
import { addCredits } from '../../src/accounts/service'
import { settledFlushes } from '../../src/credits/ledger'
import { Purger } from '../../src/db/purger'
import { accounts, creditFlushes, events, licenses, signingKeys } from '../../src/db/schema'
import postgres from 'postgres'
import { makeTestApp, MODE, TEST_DATABASE_URL } from '../support/helpers'
import { until } from '../support/servers'
import { withOverrides } from '../support/overrides'
import { decode, hwid, insertLicense, nonce } from '../support/client'
import { loggedBy } from '../support/log-capture'
import { setLogLevel } from '../../src/lib/log'

describe('credits on the client endpoints', async () => {
  const t = await makeTestApp()
  const reconciled = async (accountId: string) => {
    const [row] = await t.ctx.database.db.select().from(accounts).where(eq(accounts.id, accountId))
    return row?.credits
  }
  const live = async (s: { apiKey: string }) => (await t.req('GET', '/v1/account', { apiKey: s.apiKey })).body.credits
  const validate = (s: { appId: string; appSecret: string }, licenseKey: string, h = hwid()) =>
    t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: h, nonce: nonce() } })
  /** A session on a new license of a new account with `credits`, and its heartbeat, which renews the session token. */
  const heartbeating = async (credits: number) => {
    const s = await t.seed({ credits })
    const h = hwid()
    let token = decode((await validate(s, await insertLicense(t.ctx, s.appId), h)).body.payload).sessionToken
    const beat = async () => {
      const res = await t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: token, hwid: h } })
      if (res.status === 200) token = decode(res.body.payload).sessionToken
      return res
    }
    return { s, beat }
  }

  test('a successful validate costs 1, failures cost nothing, the reconciler moves it to PostgreSQL once', async () => {
    const s = await t.seed({ credits: 10 })
    const key = await insertLicense(t.ctx, s.appId)
    const h = hwid()
    expect((await validate(s, key, h)).status).toBe(200)
    expect((await validate(s, key, hwid())).body.error).toBe('hwid_mismatch')
    expect((await validate(s, 'ZZZZ-ZZZZ-ZZZZ-ZZZZ')).body.error).toBe('invalid_key')
    expect((await validate({ ...s, appSecret: 'wrong' }, key, h)).body.error).toBe('invalid_app')
    expect((await validate(s, key, h)).status).toBe(200)
    expect(await live(s)).toBe(8)
    expect(await reconciled(s.accountId)).toBe(10)
    await t.ctx.credits.flush()
    expect(await reconciled(s.accountId)).toBe(8)
    await t.ctx.credits.flush()
    expect(await reconciled(s.accountId)).toBe(8)
    expect(await live(s)).toBe(8)
  })

  test('with no credits left validate fails with no_credits and binds nothing', async () => {
    const s = await t.seed({ credits: 1 })
    const key = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 5 })
    expect((await validate(s, key)).status).toBe(200)
    const res = await validate(s, key)
    expect(res.status).toBe(429)
    expect(res.body).toEqual({ status: 'failed', error: 'no_credits' })
    const [row] = await t.ctx.database.db.select().from(licenses).where(eq(licenses.key, key))
    expect(row?.hwids).toHaveLength(1)
    expect(await live(s)).toBe(0)
  })

  test('credits added by the operator are spendable on the next request', async () => {
    const s = await t.seed({ credits: 0 })
    const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    expect((await validate(s, key)).body.error).toBe('no_credits')
    await addCredits(t.ctx, s.accountId, 2)
    expect((await validate(s, key)).status).toBe(200)
    expect(await live(s)).toBe(1)
  })

  test('credits added while a balance is being seeded count once', async () => {
    const s = await t.seed({ credits: 0 })
    const { store } = t.ctx
    // A seed that starts after the credits reached PostgreSQL and before the store heard of them.
    let seed: Promise<void> | undefined
    const creditsChanging: typeof store.creditsChanging = async (accountId, reconciledSeq) => {
      seed = t.ctx.credits.loadLiveBalance(accountId)
      await Bun.sleep(50)
      return store.creditsChanging(accountId, reconciledSeq)
    }
    const racing = withOverrides(store, { creditsChanging })
    await addCredits({ ...t.ctx, store: racing }, s.accountId, 5)
    await seed
    expect(await store.balance(s.accountId)).toBe(5)
  })

  test('credits whose COMMIT failed after the store heard of them are not spendable, and the live balance still counts what was charged', async () => {
    const s = await t.seed({ credits: 2 })
    const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    expect((await validate(s, key)).status).toBe(200)
    const lostAtCommit = withOverrides(t.ctx.store, {
      creditsChanging: async (accountId: string, reconciledSeq?: number) => {
        await t.ctx.store.creditsChanging(accountId, reconciledSeq)
        throw new Error('connection lost')
      },
    })
    await expect(addCredits({ ...t.ctx, store: lostAtCommit }, s.accountId, 5)).rejects.toThrow('connection lost')
    expect((await validate(s, key)).status).toBe(200)
    expect((await validate(s, key)).body.error).toBe('no_credits')
    expect(await live(s)).toBe(0)
  })

  test('a top-up that failed after the store dropped the live balance: the balance still counts the charges not flushed, and no license is issued at 0', async () => {
    const s = await t.seed({ credits: 3 })
    const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    for (let i = 0; i < 3; i++) expect((await validate(s, key)).status).toBe(200)
    expect(await live(s)).toBe(0)
    const lostAtCommit = withOverrides(t.ctx.store, {
      creditsChanging: async (accountId: string, reconciledSeq?: number) => {
        await t.ctx.store.creditsChanging(accountId, reconciledSeq)
        throw new Error('connection lost')
      },
    })
    await expect(addCredits({ ...t.ctx, store: lostAtCommit }, s.accountId, 5)).rejects.toThrow('connection lost')
    expect(await live(s)).toBe(0)
    const issued = await t.req('POST', '/v1/licenses', { apiKey: s.apiKey, body: { appId: s.appId } })
    expect(issued.status, JSON.stringify(issued.body)).toBe(402)
  })

  test('refunds not flushed when a top-up reaches the ceiling are held at it: in the live balance, a seed of it and the flush', async () => {
    const ceiling = Number.MAX_SAFE_INTEGER
    const s = await t.seed({ credits: 10 })
    const first = await t.ctx.credits.charge(s.accountId, 1, t.ctx.clock())
    const second = await t.ctx.credits.charge(s.accountId, 1, t.ctx.clock())
    await t.ctx.credits.flush()
    // One refund before the top-up, one after: both of charges already in PostgreSQL.
    await t.ctx.credits.refund(s.accountId, 1, first!.chargedUnder)
    expect((await addCredits(t.ctx, s.accountId, ceiling - 8)).credits).toBe(ceiling)
    await t.ctx.credits.refund(s.accountId, 1, second!.chargedUnder)
    expect(await live(s)).toBe(ceiling)
    // Dropped and seeded again from PostgreSQL and the refunds waiting.
    await t.ctx.store.creditsChanging(s.accountId)
    expect(await live(s)).toBe(ceiling)
    // Taking one away is no addition past it (the 2 refunds waiting keep the balance at the ceiling).
    expect((await addCredits(t.ctx, s.accountId, -1)).credits).toBe(ceiling)
    await t.ctx.credits.flush()
    expect(await reconciled(s.accountId)).toBeLessThanOrEqual(ceiling)
  })

  test('added credits answer the balance less the charges not reconciled yet', async () => {
    const s = await t.seed({ credits: 3 })
    const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    expect((await validate(s, key)).status).toBe(200)
    expect(await addCredits(t.ctx, s.accountId, 4)).toEqual({ accountId: s.accountId, credits: 6 })
    expect(await live(s)).toBe(6)
  })

  test('credits taken away while charges wait for their flush go no lower than what the account can spend, and the next ones added stay', async () => {
    const s = await t.seed({ credits: 30 })
    for (let i = 0; i < 25; i++) expect(await t.ctx.credits.charge(s.accountId, 1, t.ctx.clock())).not.toBeNull()
    expect(await addCredits(t.ctx, s.accountId, -20)).toEqual({ accountId: s.accountId, credits: 0 })
    expect(await addCredits(t.ctx, s.accountId, 10)).toEqual({ accountId: s.accountId, credits: 10 })
    await t.ctx.credits.flush()
    expect(await reconciled(s.accountId)).toBe(10)
    expect(await live(s)).toBe(10)
    // The same with the charges taken into a flush that has not reached PostgreSQL yet.
    for (let i = 0; i < 4; i++) expect(await t.ctx.credits.charge(s.accountId, 1, t.ctx.clock())).not.toBeNull()
    expect(await t.ctx.store.beginFlush(s.accountId, randomUUID())).toMatchObject({ amount: 4 })
    expect(await addCredits(t.ctx, s.accountId, -100)).toEqual({ accountId: s.accountId, credits: 0 })
    expect(await addCredits(t.ctx, s.accountId, 3)).toEqual({ accountId: s.accountId, credits: 3 })
    await t.ctx.credits.flush()
    expect(await reconciled(s.accountId)).toBe(3)
    expect(await live(s)).toBe(3)
    // A refund of a charge already flushed is on its way to PostgreSQL: the account can spend it, but a
    // removal takes PostgreSQL's balance no lower than zero, and the refund then lands on top.
    const charge = await t.ctx.credits.charge(s.accountId, 3, t.ctx.clock())
    expect(charge).not.toBeNull()
    await t.ctx.credits.flush()
    await t.ctx.credits.refund(s.accountId, 3, charge!.chargedUnder)
    expect(await addCredits(t.ctx, s.accountId, -100)).toEqual({ accountId: s.accountId, credits: 3 })
    expect(await reconciled(s.accountId)).toBe(0)
    await t.ctx.credits.flush()
    expect(await reconciled(s.accountId)).toBe(3)
    expect(await live(s)).toBe(3)
  })

  test('concurrent validates never overspend', async () => {
    const s = await t.seed({ credits: 5 })
    const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    const results = await Promise.all(Array.from({ length: 20 }, () => validate(s, key)))
    expect(results.filter((r) => r.status === 200)).toHaveLength(5)
    expect(results.filter((r) => r.body.error === 'no_credits')).toHaveLength(15)
    await t.ctx.credits.flush()
    expect(await reconciled(s.accountId)).toBe(0)
  })

  test('validates that lose the last seat to a concurrent one get hwid_mismatch and are refunded', async () => {
    const s = await t.seed({ credits: 20 })
    const key = await insertLicense(t.ctx, s.appId, { maxHwidSlots: 1 })
    // One turn: each sees the seat free, so each is charged before the binds are decided.
    const results = await Promise.all(Array.from({ length: 10 }, () => validate(s, key)))
    expect(results.filter((r) => r.status === 200)).toHaveLength(1)
    expect(results.filter((r) => r.status === 403 && r.body.error === 'hwid_mismatch')).toHaveLength(9)
    expect(await live(s)).toBe(19)
  })

  test('a bind that committed is a login, charged once, even when the store fails the reload after it', async () => {
    let failReads = false
    const flaky = withOverrides(t.ctx.store, {
      snapshotEach: async (reads) => {
        if (failReads) throw new Error('the store is unreachable')
        return t.ctx.store.snapshotEach(reads)
      },
    })
    const own = await makeTestApp({ store: flaky })
    const s = await own.seed({ credits: 10 })
    const key = await insertLicense(own.ctx, s.appId, { maxHwidSlots: 2 })
    const send = (h: string) =>
      own.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey: key, hwid: h, nonce: nonce() } })
    expect((await send('device-1')).status).toBe(200)
    failReads = true
    const second = await send('device-2')
    expect(second.status, JSON.stringify(second.body)).toBe(200)
    expect(decode(second.body.payload).hwidCount).toBe(2)
    const [row] = await own.ctx.database.db.select({ hwids: licenses.hwids }).from(licenses).where(eq(licenses.key, key))
    expect(row!.hwids).toEqual(['device-1', 'device-2'])
    expect((await own.req('GET', '/v1/account', { apiKey: s.apiKey })).body.credits).toBe(8)
    failReads = false
  })

  test('a validate that fails after its charge (no active signing key to sign with) is refunded and records no license.validated', async () => {
    const s = await t.seed({ credits: 5 })
    const key = await insertLicense(t.ctx, s.appId)
    await t.req('POST', `/v1/apps/${s.appId}/webhooks`, { apiKey: s.apiKey, body: { url: 'https://203.0.113.1/hook', events: ['license.validated'] } })
    await t.ctx.database.db.update(signingKeys).set({ active: false }).where(eq(signingKeys.appId, s.appId))
    // A change through the API, so the app is read again, without its key.
    expect((await t.req('PATCH', `/v1/apps/${s.appId}`, { apiKey: s.apiKey, body: { name: 'Keyless' } })).status).toBe(200)
    // The first binds a seat, the second finds it bound: each is charged, and each fails at the signature.
    const h = hwid()
    for (let i = 0; i < 2; i++) expect((await validate(s, key, h)).body).toEqual({ status: 'failed', error: 'system_error' })
    expect(await live(s)).toBe(5)
    await t.ctx.validatedEvents.flush()
    expect(await t.ctx.database.db.select().from(events).where(and(eq(events.appId, s.appId), eq(events.event, 'license.validated')))).toEqual([])
  })

  test('a refund that cannot reach the store leaves the client the answer its request earned, and is logged', async () => {
    const unreachable = withOverrides(t.ctx.store, {
      refund: async () => {
        throw new Error('the store is unreachable')
      },
    })
    const down = await makeTestApp({ store: unreachable })
    const s = await down.seed({ credits: 20 })
    const key = await insertLicense(down.ctx, s.appId, { maxHwidSlots: 1 })
    const send = () =>
      down.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey: key, hwid: hwid(), nonce: nonce() } })
    let results: Awaited<ReturnType<typeof send>>[] = []
    setLogLevel('warn')
    const logged = await loggedBy(async () => {
      results = await Promise.all(Array.from({ length: 10 }, send))
    }).finally(() => setLogLevel('error'))
    expect(results.filter((r) => r.status === 200)).toHaveLength(1)
    expect(results.filter((r) => r.status === 403 && r.body.error === 'hwid_mismatch')).toHaveLength(9)
    const lost = logged.filter((e) => e.msg === 'a refund failed or missed its deadline: the failed action may stay charged')
    expect(lost).toHaveLength(9)
    expect(lost.every((e) => e.accountId === s.accountId && e.cost === 1)).toBe(true)
  })

  test('every 10th heartbeat of a license costs 1 credit; a refused one is not counted', async () => {
    const { s, beat } = await heartbeating(2)
    for (let i = 1; i <= 9; i++) expect((await beat()).status).toBe(200)
    expect(await live(s)).toBe(1)
    expect((await beat()).status).toBe(200)
    expect(await live(s)).toBe(0)
    for (let i = 1; i <= 9; i++) expect((await beat()).status).toBe(200)
    expect((await beat()).body.error).toBe('no_credits')
    await addCredits(t.ctx, s.accountId, 1)
    expect((await beat()).status).toBe(200)
    expect(await live(s)).toBe(0)
  })

  test('a heartbeat that fails after its count (no active signing key) is not counted: the 10th successful one is the one charged', async () => {
    const { s, beat } = await heartbeating(10)
    const signing = async (active: boolean) => {
      await t.ctx.database.db.update(signingKeys).set({ active }).where(eq(signingKeys.appId, s.appId))
      // A change through the API, so the app is read again.
      expect((await t.req('PATCH', `/v1/apps/${s.appId}`, { apiKey: s.apiKey, body: { name: active ? 'Keyed' : 'Keyless' } })).status).toBe(200)
    }
    for (let i = 1; i <= 9; i++) expect((await beat()).status).toBe(200)
    // The 10th fails at its signature: charged, refunded, and not counted.
    await signing(false)
    for (let i = 1; i <= 3; i++) expect((await beat()).body).toEqual({ status: 'failed', error: 'system_error' })
    expect(await live(s)).toBe(9)
    await signing(true)
    expect((await beat()).status).toBe(200)
    expect(await live(s)).toBe(8)
  })

  test('the sandbox app is never billed', async () => {
    const s = await t.seed({ credits: 0, sandbox: true })
    const key = await insertLicense(t.ctx, s.appId)
    const h = hwid()
    const res = await validate(s, key, h)
    expect(res.status).toBe(200)
    const token = decode(res.body.payload).sessionToken
    for (let i = 0; i < 10; i++) {
      expect((await t.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: token, hwid: h } })).status).toBe(200)
    }
  })

  test('a flush interrupted after its PostgreSQL commit is not applied twice', async () => {
    const s = await t.seed({ credits: 10 })
    const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    for (let i = 0; i < 3; i++) expect((await validate(s, key)).status).toBe(200)
    const flush = await t.ctx.store.beginFlush(s.accountId, crypto.randomUUID())
    if (!flush || flush === 'behind') throw new Error(`no flush begun: ${flush}`)
    expect(flush.amount).toBe(3)
    // The crashed instance committed its transaction but never told the store.
    await t.ctx.database.db.transaction(async (tx) => {
      await tx.insert(creditFlushes).values({ id: flush.id, accountId: s.accountId, amount: flush.amount })
      await tx.update(accounts).set({ credits: 7 }).where(eq(accounts.id, s.accountId))
    })
    expect((await validate(s, key)).status).toBe(200)
    // One pass applies the crashed instance's flush (once) and the charge pending beside it.
    await t.ctx.credits.flush()
    expect(await reconciled(s.accountId)).toBe(6)
    expect(await live(s)).toBe(6)
    expect(await t.ctx.store.dirtyAccounts(t.ctx.store.shardOf(s.accountId))).not.toContain(s.accountId)
  })

  test("a flush's end that comes late, after the next flush began, leaves the account to be flushed", async () => {
    const s = await t.seed({ credits: 10 })
    const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
    for (let i = 0; i < 3; i++) expect((await validate(s, key)).status).toBe(200)
    await t.ctx.credits.flush()
    expect(await reconciled(s.accountId)).toBe(7)
    // Another instance began the next flush and has not committed it yet...
    expect((await validate(s, key)).status).toBe(200)
    expect(await t.ctx.store.beginFlush(s.accountId, crypto.randomUUID())).toMatchObject({ amount: 1 })
    // ...when an end of an earlier flush id reaches the store (resent after a reconnect, or late).
    await t.ctx.store.endFlush(s.accountId, crypto.randomUUID())
    expect(await t.ctx.store.dirtyAccounts(t.ctx.store.shardOf(s.accountId))).toContain(s.accountId)
    // That instance is gone: the next pass of this one applies its flush.
    await t.ctx.credits.flush()
    expect(await reconciled(s.accountId)).toBe(6)
    expect(await live(s)).toBe(6)
  })

  test('charges of a deleted account are dropped without holding up the others', async () => {
    const gone = await t.seed({ credits: 10 })
    const kept = await t.seed({ credits: 10 })
    for (const s of [gone, kept]) {
      const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
      expect((await validate(s, key)).status).toBe(200)
    }
    await t.ctx.database.db.delete(accounts).where(eq(accounts.id, gone.accountId))
    await t.ctx.credits.flush()
    expect(await reconciled(kept.accountId)).toBe(9)
    expect(await t.ctx.store.dirtyAccounts(t.ctx.store.shardOf(gone.accountId))).not.toContain(gone.accountId)
  })
})

describe('flush records', async () => {
  const t = await makeTestApp()
  const record = (accountId: string, hoursAgo: number) => ({
    id: randomUUID(),
    accountId,
    amount: 1,
    createdAt: new Date(Date.now() - hoursAgo * 3_600_000),
  })

  test("an account's flush records older than an hour go, but its newest, the only one the store can still name", async () => {
    const [busy, quiet] = [await t.seed(), await t.seed()]
    const records = [record(busy.accountId, 3), record(busy.accountId, 2), record(busy.accountId, 0.5), record(busy.accountId, 0), record(quiet.accountId, 5)]
    await t.ctx.database.db.insert(creditFlushes).values(records)
    await new Purger(t.ctx.database.db, settledFlushes).purge()
    const left = await t.ctx.database.db
      .select({ id: creditFlushes.id })
      .from(creditFlushes)
      .where(inArray(creditFlushes.id, records.map((r) => r.id)))
    expect(left.map((r) => r.id).sort()).toEqual(records.slice(2).map((r) => r.id).sort())
  })
})

test.skipIf(MODE !== 'postgres')("a flush waiting on the store holds the account's credits, not the account: its apps and keys can still be created", async () => {
  const base = await makeTestApp()
  let release = () => {}
  const held = new Promise<void>((resolve) => {
    release = resolve
  })
  let waiting = false
  let flushing = ''
  const t = await makeTestApp({
    store: withOverrides(base.ctx.store, {
      beginFlush: async (...args: Parameters<typeof base.ctx.store.beginFlush>) => {
        // Other tests' accounts of the shared store flush as ever.
        if (args[0] === flushing) {
          waiting = true
          await held
        }
        return base.ctx.store.beginFlush(...args)
      },
    }),
  })
  const s = await t.seed({ credits: 5 })
  flushing = s.accountId
  expect(await t.ctx.credits.charge(s.accountId, 1, t.ctx.clock())).not.toBeNull()
  const flushed = t.ctx.credits.flush()
  expect(await until(async () => waiting, (w) => w)).toBe(true)
  try {
    const created = await Promise.race([t.req('POST', '/v1/apps', { apiKey: s.apiKey, body: { name: 'While flushing' } }), Bun.sleep(1500)])
    expect((created as { status?: number } | undefined)?.status).toBe(201)
  } finally {
    release()
    await flushed
  }
  expect(await t.ctx.credits.currentBalance(s.accountId)).toBe(4)
})

test.skipIf(MODE !== 'postgres')("a flush record carries the time of its insert under the account's lock, not of its transaction's start: an account's records are in the order its flushes ran", async () => {
  const t = await makeTestApp()
  const s = await t.seed({ credits: 5 })
  expect(await t.ctx.credits.charge(s.accountId, 1, t.ctx.clock())).not.toBeNull()
  const other = postgres(TEST_DATABASE_URL!, { max: 1, onnotice: () => {} })
  try {
    let released = 0
    const { promise: held, resolve: lockHeld } = Promise.withResolvers<void>()
    // Another instance's flush of the account holds its row: this one's transaction waits for it.
    const holder = other.begin(async (sql) => {
      await sql`SELECT 1 FROM accounts WHERE id = ${s.accountId} FOR UPDATE`
      lockHeld()
      await Bun.sleep(300)
      released = Date.now()
    })
    // Not a fixed wait: a connection slow to open (a loaded machine) let the flush go first.
    await held
    await Promise.all([holder, t.ctx.credits.flush()])
    const [record] = await t.ctx.database.db.select().from(creditFlushes).where(eq(creditFlushes.accountId, s.accountId))
    expect(record!.createdAt.getTime()).toBeGreaterThanOrEqual(released - 20)
  } finally {
    await other.end({ timeout: 1 })
  }
})
