import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomUUID } from 'node:crypto'
import { MemoryStore } from '../../src/store/memory'
import { RedisStore } from '../../src/store/redis'
import { type AuthorizeInput, HEARTBEAT_COUNT_TTL_SECONDS, keys, type Store } from '../../src/store/store'
import { TEST_REDIS_URL } from '../support/helpers'
import { until } from '../support/servers'
import { request } from './request'

/** The one shard of a single Redis and of the in-process store; PROBE names it to a snapshot. */
const S = ''
const PROBE = `ls:${S}:test:probe`
/** A charge's answer: it names the store generation it was made under ('' in memory), for its refund. */
const charged = (n: number) => ({ kind: 'ok' as const, charged: n, chargedUnder: expect.any(String) as string })

// The same cases against both twins; Redis runs whenever the pass has one (the PostgreSQL + Redis pass).
const stores: [string, () => Store][] = [['memory', () => new MemoryStore()]]
if (TEST_REDIS_URL) {
  const url = TEST_REDIS_URL
  stores.push(['redis', () => new RedisStore(url)])
}

describe.each(stores)('%s store: authorize', (_name, make) => {
  const store = make()
  afterAll(() => store.close())
  const now = Date.parse('2031-01-01T00:00:00Z')
  let generation = 0
  beforeAll(async () => {
    generation = (await store.snapshot([PROBE])).generation
  })
  const base = (over: Partial<AuthorizeInput> = {}): AuthorizeInput => request(generation, now, over)
  const id = () => randomUUID()

  test('stale epochs change nothing and report the current values', async () => {
    const ep = `ls:test:ep:${id()}`
    const nonceKey = `ls:test:n:${id()}`
    await store.bump([ep, ep])
    const [current] = (await store.epochs([ep])) as [number]
    const r = await store.authorize(base({ epochs: [{ key: ep, expected: 0 }], nonce: { key: nonceKey, ttlSeconds: 60 } }))
    expect(r).toEqual({ kind: 'stale', epochs: [current] })
    const ok = await store.authorize(base({ epochs: [{ key: ep, expected: current }], nonce: { key: nonceKey, ttlSeconds: 60 } }))
    expect(ok).toEqual(charged(0))
  })

  test('nonce: claimed once; a denied request still claims it', async () => {
    const nonceKey = `ls:test:n:${id()}`
    expect(await store.authorize(base({ nonce: { key: nonceKey, ttlSeconds: 60 }, deny: true }))).toEqual({ kind: 'denied' })
    expect(await store.authorize(base({ nonce: { key: nonceKey, ttlSeconds: 60 } }))).toEqual({ kind: 'replay' })
  })

  test('buckets are taken all or none and refill continuously', async () => {
    const a = { key: `ls:test:b:${id()}`, capacity: 2, refillPerSecond: 1 }
    const b = { key: `ls:test:b:${id()}`, capacity: 1, refillPerSecond: 1 }
    expect((await store.authorize(base({ buckets: [a, b] }))).kind).toBe('ok')
    expect(await store.authorize(base({ buckets: [a, b] }))).toEqual({ kind: 'limited', retryAfterMs: 1000 })
    // `a` kept its second token: the refused call took nothing.
    expect((await store.authorize(base({ buckets: [a] }))).kind).toBe('ok')
    expect((await store.authorize(base({ buckets: [a] }))).kind).toBe('limited')
    expect((await store.authorize(base({ nowMs: now + 1000, buckets: [a, b] }))).kind).toBe('ok')
  })

  test('a bucket that refilled while its key lives on holds its capacity from now, not from its old arrival time', async () => {
    const a = { key: `ls:test:b:${id()}`, capacity: 2, refillPerSecond: 1 }
    expect((await store.authorize(base({ buckets: [a] }))).kind).toBe('ok')
    // Full again five seconds later. On Redis the key lives on (its expiry counts real time, which the
    // test does not wait for), so its old arrival time is read; the in-process twin has dropped it by then.
    const later = now + 5000
    expect((await store.authorize(base({ nowMs: later, buckets: [a] }))).kind).toBe('ok')
    expect((await store.authorize(base({ nowMs: later, buckets: [a] }))).kind).toBe('ok')
    expect(await store.authorize(base({ nowMs: later, buckets: [a] }))).toEqual({ kind: 'limited', retryAfterMs: 1000 })
  })

  test('the ceiling counts before the buckets and limits', async () => {
    const ceiling = { key: `ls:test:d:${id()}`, limit: 2, ttlSeconds: 60 }
    const bucket = { key: `ls:test:b:${id()}`, capacity: 1, refillPerSecond: 0.001 }
    expect((await store.authorize(base({ ceiling, buckets: [bucket] }))).kind).toBe('ok')
    expect((await store.authorize(base({ ceiling, buckets: [bucket] }))).kind).toBe('limited')
    expect((await store.authorize(base({ ceiling, buckets: [bucket] }))).kind).toBe('quota')
  })

  test('charges need a loaded balance, never go below zero and count as pending', async () => {
    const acct = id()
    const charge = { accountId: acct, cost: 1, counter: null }
    expect(await store.authorize(base({ charge }))).toEqual({ kind: 'no_balance' })
    expect(await store.loadBalance(acct, { epoch: 1, flushId: null, seq: 0 }, 2, false)).toBe('stale')
    expect(await store.loadBalance(acct, { epoch: 0, flushId: null, seq: 0 }, 2, false)).toBe('ok')
    const first = await store.authorize(base({ charge }))
    expect(first).toEqual(charged(1))
    expect(await store.authorize(base({ charge }))).toEqual(charged(1))
    expect(await store.authorize(base({ charge }))).toEqual({ kind: 'no_credits' })
    expect(await store.balance(acct)).toBe(0)
    expect(await store.dirtyAccounts(store.shardOf(acct))).toContain(acct)
    await store.creditsChanging(acct)
    expect(await store.balance(acct)).toBeNull()
    expect(await store.loadBalance(acct, { epoch: 0, flushId: null, seq: 1 }, 7, false)).toBe('stale')
    // PostgreSQL holds 2 + 5 now: the seed takes off the 2 charges not reconciled yet.
    expect(await store.loadBalance(acct, { epoch: 1, flushId: null, seq: 1 }, 7, false)).toBe('ok')
    expect(await store.balance(acct)).toBe(5)
    await store.refund(acct, 1, first.kind === 'ok' ? first.chargedUnder : '')
    expect(await store.balance(acct)).toBe(6)
    // The credit sequence: 1 taken by the change of credits, 2 by this flush.
    const flush = await store.beginFlush(acct, 'f1')
    expect(flush).toEqual({ id: 'f1', amount: 1, seq: 2 })
    expect(await store.beginFlush(acct, 'f2')).toEqual({ id: 'f1', amount: 1, seq: 2 })
    await store.endFlush(acct, 'f1')
    expect(await store.beginFlush(acct, 'f3')).toBeNull()
    await store.endFlush(acct, '')
    expect(await store.dirtyAccounts(store.shardOf(acct))).not.toContain(acct)
  })

  test('heartbeat counter: every n-th call is charged, a refused charge is rolled back', async () => {
    const acct = id()
    await store.loadBalance(acct, { epoch: 0, flushId: null, seq: 0 }, 1, false)
    const charge = { accountId: acct, cost: 1, counter: { key: `ls:test:hb:${id()}`, every: 3 } }
    const kinds: string[] = []
    for (let i = 0; i < 7; i++) {
      const r = await store.authorize(base({ charge }))
      kinds.push(r.kind === 'ok' ? `ok${r.charged}` : r.kind)
    }
    expect(kinds).toEqual(['ok0', 'ok0', 'ok1', 'ok0', 'ok0', 'no_credits', 'no_credits'])
    await store.creditsChanging(acct)
    expect(await store.authorize(base({ charge }))).toEqual({ kind: 'no_balance' })
    // 1 + 1 in PostgreSQL, less the 1 charge not reconciled yet.
    await store.loadBalance(acct, { epoch: 1, flushId: null, seq: 1 }, 2, false)
    expect(await store.authorize(base({ charge }))).toEqual(charged(1))
  })

  test('a denied request is never charged', async () => {
    const acct = id()
    await store.loadBalance(acct, { epoch: 0, flushId: null, seq: 0 }, 1, false)
    expect(await store.authorize(base({ deny: true, charge: { accountId: acct, cost: 1, counter: null } }))).toEqual({ kind: 'denied' })
    expect(await store.balance(acct)).toBe(1)
  })

  test('requests issued together are each checked in order and each get their own answer', async () => {
    // Multi-byte characters: each key must be cut at its UTF-8 length, not its JavaScript length.
    const nonceKey = `ls:test:n:${id()}:é€😀`
    const ep = `ls:test:ep:${id()}`
    await store.bump([ep])
    const [current] = (await store.epochs([ep])) as [number]
    const bucket = { key: `ls:test:b:${id()}`, capacity: 2, refillPerSecond: 0.001 }
    const replies = await Promise.all([
      store.authorize(base({ nonce: { key: nonceKey, ttlSeconds: 60 }, buckets: [bucket] })),
      store.authorize(base({ epochs: [{ key: ep, expected: 0 }] })),
      store.authorize(base({ nonce: { key: nonceKey, ttlSeconds: 60 }, buckets: [bucket] })),
      store.authorize(base({ buckets: [bucket] })),
      store.authorize(base({ deny: true })),
    ])
    expect(replies).toEqual([
      charged(0),
      { kind: 'stale', epochs: [current] },
      { kind: 'replay' },
      { kind: 'limited', retryAfterMs: expect.any(Number) },
      { kind: 'denied' },
    ])
  })

  test('requests issued together share one balance, counter and bucket as if one after another', async () => {
    const acct = id()
    await store.loadBalance(acct, { epoch: 0, flushId: null, seq: 0 }, 2, false)
    const charge = { accountId: acct, cost: 1, counter: null }
    const counted = { accountId: acct, cost: 1, counter: { key: `ls:test:hb:${id()}`, every: 2 } }
    const bucket = { key: `ls:test:b:${id()}`, capacity: 4, refillPerSecond: 0.001 }
    const replies = await Promise.all([
      store.authorize(base({ charge, buckets: [bucket] })),
      store.authorize(base({ charge: counted, buckets: [bucket] })),
      store.authorize(base({ charge: counted, buckets: [bucket] })),
      store.authorize(base({ charge, buckets: [bucket] })),
      store.authorize(base({ charge, buckets: [bucket] })),
    ])
    expect(replies).toEqual([
      charged(1),
      charged(0),
      charged(1),
      { kind: 'no_credits' },
      { kind: 'limited', retryAfterMs: expect.any(Number) },
    ])
    expect(await store.balance(acct)).toBe(0)
    expect(await store.dirtyAccounts(store.shardOf(acct))).toContain(acct)
    expect(await store.beginFlush(acct, 'f')).toEqual({ id: 'f', amount: 2, seq: 1 })
  })

  test('an account refused for want of credits joins the dirty set, for its flush pass to check its balance', async () => {
    const acct = id()
    await store.loadBalance(acct, { epoch: 0, flushId: null, seq: 0 }, 0, false)
    expect(await store.authorize(base({ charge: { accountId: acct, cost: 1, counter: null } }))).toEqual({ kind: 'no_credits' })
    expect(await store.dirtyAccounts(store.shardOf(acct))).toContain(acct)
    expect(await store.beginFlush(acct, 'f')).toBeNull()
    await store.endFlush(acct, '')
    expect(await store.dirtyAccounts(store.shardOf(acct))).not.toContain(acct)
  })

  test("a store behind PostgreSQL's credit sequence (back from an older copy) drops what it holds of the account's credits", async () => {
    const acct = id()
    const charge = { accountId: acct, cost: 1, counter: null }
    await store.loadBalance(acct, { epoch: 0, flushId: null, seq: 0 }, 5, false)
    for (let i = 0; i < 2; i++) expect(await store.authorize(base({ charge }))).toEqual(charged(1))
    expect(await store.beginFlush(acct, 'f1')).toEqual({ id: 'f1', amount: 2, seq: 1 })
    // PostgreSQL has recorded sequence 4: changes the store no longer holds. A flush drops the rest...
    expect(await store.beginFlush(acct, 'f2', 4)).toBe('behind')
    expect(await store.balance(acct)).toBeNull()
    expect(await store.creditState(acct)).toEqual({ epoch: 1, flushId: null, seq: 4, pending: 0, flushing: 0 })
    // ...and the balance is seeded from PostgreSQL alone: nothing pending or in flight is taken off.
    expect(await store.loadBalance(acct, { epoch: 1, flushId: null, seq: 4 }, 9, false, 4)).toBe('ok')
    expect(await store.balance(acct)).toBe(9)
    expect(await store.beginFlush(acct, 'f3', 4)).toBeNull()
    expect(await store.creditsChanging(acct)).toBe(5)

    // A seed that finds the store behind drops the pending charges and the flush record it holds.
    const other = id()
    await store.loadBalance(other, { epoch: 0, flushId: null, seq: 0 }, 5, false)
    expect(await store.authorize(base({ charge: { ...charge, accountId: other } }))).toEqual(charged(1))
    expect(await store.beginFlush(other, 'g1')).toEqual({ id: 'g1', amount: 1, seq: 1 })
    expect(await store.authorize(base({ charge: { ...charge, accountId: other } }))).toEqual(charged(1))
    expect(await store.creditsChanging(other)).toBe(2)
    expect(await store.loadBalance(other, { epoch: 1, flushId: 'g1', seq: 2 }, 20, false, 3)).toBe('ok')
    expect(await store.balance(other)).toBe(20)
    expect(await store.creditState(other)).toEqual({ epoch: 1, flushId: null, seq: 3, pending: 0, flushing: 0 })
    expect(await store.beginFlush(other, 'g2', 3)).toBeNull()
  })

  test('a request read under another generation changes nothing and learns the current one', async () => {
    const nonce = { key: `ls:test:n:${id()}`, ttlSeconds: 60 }
    expect(await store.authorize(base({ generation: generation + 1000, nonce }))).toEqual({ kind: 'new_generation', generation })
    expect(await store.authorize(base({ nonce }))).toEqual(charged(0))
  })

  test('snapshotEach: each read takes its own admission token first, and an empty bucket reads nothing of its own', async () => {
    const [ep1, ep2] = [`ls:test:ep:${id()}`, `ls:test:ep:${id()}`]
    await store.bump([ep1, ep2, ep2])
    const [e1, e2] = (await store.epochs([ep1, ep2])) as [number, number]
    const admission = { key: `ls:test:b:${id()}`, capacity: 1, refillPerSecond: 0.001, nowMs: now }
    expect(await store.snapshotEach([{ key: ep1, admission }, { key: ep2 }])).toEqual({
      generation,
      reads: [{ kind: 'ok', epoch: e1 }, { kind: 'ok', epoch: e2 }],
    })
    // The bucket is empty now: its read is refused, the reads around it are not.
    const other = { ...admission, key: `ls:test:b:${id()}` }
    expect(await store.snapshotEach([{ key: ep2 }, { key: ep1, admission }, { key: ep2, admission: other }])).toEqual({
      generation,
      reads: [{ kind: 'ok', epoch: e2 }, { kind: 'limited', retryAfterMs: expect.any(Number) }, { kind: 'ok', epoch: e2 }],
    })
    // The same bucket as the script's: a request naming it is limited too.
    expect((await store.authorize(base({ buckets: [admission] }))).kind).toBe('limited')
    expect(await store.snapshot([ep1, ep2])).toEqual({ generation, epochs: [e1, e2] })
  })

  test("a change of credits finds a store one change behind PostgreSQL's credit sequence, and drops what it holds of the account's charges first", async () => {
    const acct = id()
    await store.loadBalance(acct, { epoch: 0, flushId: null, seq: 0 }, 10, false)
    expect(await store.authorize(base({ charge: { accountId: acct, cost: 2, counter: null } }))).toEqual(charged(2))
    // PostgreSQL recorded sequence 1, which this copy of the store never saw: its pending 2 are older.
    expect(await store.creditsChanging(acct, 1)).toBe(2)
    expect(await store.creditState(acct)).toEqual({ epoch: 1, flushId: null, seq: 2, pending: 0, flushing: 0 })
    // Not behind: what the store holds stays.
    const current = id()
    await store.loadBalance(current, { epoch: 0, flushId: null, seq: 0 }, 10, false)
    await store.authorize(base({ charge: { accountId: current, cost: 2, counter: null } }))
    expect(await store.creditsChanging(current, 0)).toBe(1)
    expect(await store.creditState(current)).toMatchObject({ seq: 1, pending: 2 })
  })

  test('creditState reports the account epoch, the unfinished flush, the credit sequence and the charges a seed must account for', async () => {
    const acct = id()
    expect(await store.creditState(acct)).toEqual({ epoch: 0, flushId: null, seq: 0, pending: 0, flushing: 0 })
    await store.loadBalance(acct, { epoch: 0, flushId: null, seq: 0 }, 10, false)
    await store.authorize(base({ charge: { accountId: acct, cost: 3, counter: null } }))
    expect(await store.creditState(acct)).toEqual({ epoch: 0, flushId: null, seq: 0, pending: 3, flushing: 0 })
    await store.creditsChanging(acct)
    expect(await store.beginFlush(acct, 'f1')).toEqual({ id: 'f1', amount: 3, seq: 2 })
    expect(await store.creditState(acct)).toEqual({ epoch: 1, flushId: 'f1', seq: 2, pending: 0, flushing: 3 })
    await store.endFlush(acct, 'f1')
    expect(await store.creditState(acct)).toEqual({ epoch: 1, flushId: null, seq: 2, pending: 0, flushing: 0 })
  })

  test('a seed that runs after a flush began and ended since its read writes nothing (it would count that flush twice)', async () => {
    const acct = id()
    await store.loadBalance(acct, { epoch: 0, flushId: null, seq: 0 }, 10, false)
    await store.authorize(base({ charge: { accountId: acct, cost: 3, counter: null } }))
    await store.creditsChanging(acct)
    // A seed reads the state and PostgreSQL's 10 (the 3 not moved yet), then waits...
    const seen = await store.creditState(acct)
    // ...while a flush moves the 3 into PostgreSQL (10 → 7) and ends: the epoch and flush record are as read.
    expect(await store.beginFlush(acct, 'f1')).toMatchObject({ id: 'f1', amount: 3 })
    await store.endFlush(acct, 'f1')
    expect(await store.creditState(acct)).toMatchObject({ epoch: seen.epoch, flushId: seen.flushId })
    // Run now, it would seed 10 less nothing pending: the 3 credits spent twice over.
    expect(await store.loadBalance(acct, seen, 10, false)).toBe('stale')
    expect(await store.balance(acct)).toBeNull()
    expect(await store.loadBalance(acct, await store.creditState(acct), 7, false)).toBe('ok')
    expect(await store.balance(acct)).toBe(7)
  })

  test('key names stay distinct per account', () => {
    expect(new Set([keys.balance(S, 'a'), keys.pendingCharges(S, 'a'), keys.flushing(S, 'a'), keys.accountEpoch(S, 'a'), keys.creditSeq(S, 'a')]).size).toBe(5)
  })
})

describe.skipIf(!TEST_REDIS_URL)('redis store: generation', () => {
  test('a lost generation key makes the next call answer a new generation, and reads then carry it', async () => {
    const store = new RedisStore(TEST_REDIS_URL as string)
    try {
      const first = await store.snapshot([PROBE])
      const input = request(first.generation, Date.now())
      expect(await store.authorize(input)).toEqual(charged(0))
      // What a restart without persistence or a FLUSHALL leaves: no generation key.
      await store.redis.del(keys.generation(S))
      const answer = await store.authorize(input)
      expect(answer).toEqual({ kind: 'new_generation', generation: expect.any(Number) })
      const next = answer.kind === 'new_generation' ? answer.generation : 0
      expect(next).toBeGreaterThan(first.generation)
      expect(await store.snapshot([PROBE])).toEqual({ generation: next, epochs: first.epochs })
      expect(await store.authorize({ ...input, generation: next })).toEqual(charged(0))
    } finally {
      await store.close()
    }
  })
})

describe.skipIf(!TEST_REDIS_URL)('redis store: expiries', () => {
  test('a bucket key lives until a second after its bucket is full again, in whole seconds; a nonce for its ttl', async () => {
    const store = new RedisStore(TEST_REDIS_URL as string)
    try {
      const { generation } = await store.snapshot([PROBE])
      // Ten seconds a token: after three takes the bucket is full again in 30 s.
      const bucket = { key: `ls:test:b:${randomUUID()}`, capacity: 5, refillPerSecond: 0.1 }
      const nonceKeys = [0, 1, 2].map(() => `ls:test:n:${randomUUID()}`)
      const now = Date.now()
      const answers = await Promise.all(
        nonceKeys.map((key, i) => store.authorize(request(generation, now, { buckets: [bucket], nonce: { key, ttlSeconds: 60 + i } }))),
      )
      expect(answers.map((a) => a.kind)).toEqual(['ok', 'ok', 'ok'])
      const bucketTtl = await store.redis.pttl(bucket.key)
      expect(bucketTtl).toBeGreaterThan(30_000)
      expect(bucketTtl).toBeLessThanOrEqual(31_000)
      const nonceTtls = await Promise.all(nonceKeys.map((key) => store.redis.ttl(key)))
      // Each its own, though all three went in one call (one text per distinct value).
      expect(nonceTtls.map((ttl, i) => 60 + i - ttl).every((lag) => lag >= 0 && lag <= 1)).toBe(true)
    } finally {
      await store.close()
    }
  })
})

describe("heartbeat counters end HEARTBEAT_COUNT_TTL_SECONDS after their cycle's first count", () => {
  const DAY_MS = 86_400_000

  test.skipIf(!TEST_REDIS_URL)("redis: a cycle's first count gives the counter its lifetime, the others leave it; an uncount after it ended leaves no counter", async () => {
    const store = new RedisStore(TEST_REDIS_URL as string)
    try {
      const acct = randomUUID()
      await store.loadBalance(acct, { epoch: 0, flushId: null, seq: 0 }, 5, false)
      const { generation } = await store.snapshot([PROBE])
      const counter = { key: `ls:test:hb:${randomUUID()}`, every: 3 }
      const heartbeat = () => store.authorize(request(generation, Date.now(), { charge: { accountId: acct, cost: 1, counter } }))
      const lifetimeGiven = async () => HEARTBEAT_COUNT_TTL_SECONDS - (await store.redis.ttl(counter.key))
      const first = await heartbeat()
      expect(first).toEqual(charged(0))
      expect(await lifetimeGiven()).toBeWithin(0, 3)
      await store.redis.expire(counter.key, 60)
      expect(await heartbeat()).toEqual(charged(0))
      expect(await heartbeat()).toEqual(charged(1))
      expect(await store.redis.ttl(counter.key)).toBeLessThanOrEqual(60)
      // The fourth starts the next cycle.
      expect(await heartbeat()).toEqual(charged(0))
      expect(await lifetimeGiven()).toBeWithin(0, 3)
      // The lifetime ends (the key expires), then the first heartbeat's failure is taken back.
      await store.redis.del(counter.key)
      await store.uncount(counter.key, (first as { chargedUnder: string }).chargedUnder)
      expect(await store.redis.exists(counter.key)).toBe(0)
    } finally {
      await store.close()
    }
  })

  test("in process: a cycle not done within the lifetime starts afresh, and an uncount after it ended sets no count", async () => {
    const store = new MemoryStore()
    try {
      const acct = randomUUID()
      await store.loadBalance(acct, { epoch: 0, flushId: null, seq: 0 }, 5, false)
      const { generation } = await store.snapshot([PROBE])
      const counter = { key: `ls:test:hb:${randomUUID()}`, every: 3 }
      const heartbeat = (nowMs: number) => store.authorize(request(generation, nowMs, { charge: { accountId: acct, cost: 1, counter } }))
      const lifetime = HEARTBEAT_COUNT_TTL_SECONDS * 1000
      const start = Date.now() - 3 * lifetime
      expect(await heartbeat(start)).toEqual(charged(0))
      expect(await heartbeat(start + lifetime - DAY_MS)).toEqual(charged(0))
      // The cycle's lifetime ran out before its third count: it starts again.
      expect(await heartbeat(start + lifetime + DAY_MS)).toEqual(charged(0))
      expect(await heartbeat(start + lifetime + 2 * DAY_MS)).toEqual(charged(0))
      expect(await heartbeat(start + lifetime + 3 * DAY_MS)).toEqual(charged(1))
      // A cycle started twice the lifetime ago has ended before this uncount of its heartbeat.
      expect(await heartbeat(start + lifetime + 4 * DAY_MS)).toEqual(charged(0))
      await store.uncount(counter.key, '')
      // The count starts afresh: the third heartbeat from now is the charged one.
      const kinds = []
      for (let i = 0; i < 3; i++) kinds.push((await heartbeat(Date.now())) as { charged: number })
      expect(kinds.map((r) => r.charged)).toEqual([0, 0, 1])
    } finally {
      await store.close()
    }
  })
})

/** The store's authorize calls, of which the next one after holdNext() runs but has its reply held until deliver(). */
function holdingReplies(store: RedisStore) {
  const original = store.redis.lsAuthorize.bind(store.redis)
  let hold = false
  let deliver = () => {}
  store.redis.lsAuthorize = (...args: Parameters<typeof original>) => {
    const call = original(...args)
    if (!hold) return call
    hold = false
    const held = new Promise<void>((resolve) => {
      deliver = resolve
    })
    return call.then(async (reply) => {
      await held
      return reply
    })
  }
  return {
    holdNext: () => {
      hold = true
    },
    deliver: () => deliver(),
  }
}

describe.skipIf(!TEST_REDIS_URL)('redis store: one authorize call in flight', () => {
  test('requests that arrive while a call is in flight ride together on the next one', async () => {
    const store = new RedisStore(TEST_REDIS_URL as string)
    try {
      const original = store.redis.lsAuthorize.bind(store.redis)
      const sizes: number[] = []
      let inFlight = 0
      let mostInFlight = 0
      store.redis.lsAuthorize = async (generationKey: string, packed: Buffer, generation: string, fresh: string) => {
        mostInFlight = Math.max(mostInFlight, ++inFlight)
        const call = original(generationKey, packed, generation, fresh)
        // The call's argument starts with its key count; each request here has one key, its nonce.
        sizes.push(packed.readUInt32LE(0))
        try {
          return await call
        } finally {
          inFlight--
        }
      }
      const read = await store.snapshot([PROBE])
      const input = (): AuthorizeInput => ({
        nowMs: Date.now(),
        shard: S,
        generation: read.generation,
        epochs: [],
        ceiling: null,
        buckets: [],
        nonce: { key: `ls:test:n:${randomUUID()}`, ttlSeconds: 60 },
        deny: false,
        charge: null,
      })
      const first = store.authorize(input())
      await Promise.resolve()
      expect(sizes).toEqual([1])
      const rest = Array.from({ length: 5 }, () => store.authorize(input()))
      const replies = await Promise.all([first, ...rest])
      expect(replies.every((r) => r.kind === 'ok')).toBe(true)
      expect(sizes).toEqual([1, 5])
      expect(mostInFlight).toBe(1)
    } finally {
      await store.close()
    }
  })

  test('a call that throws before it is sent fails its own requests and holds up no later one', async () => {
    const store = new RedisStore(TEST_REDIS_URL as string)
    try {
      const original = store.redis.lsAuthorize.bind(store.redis)
      let throwNext = true
      store.redis.lsAuthorize = (...args: Parameters<typeof original>) => {
        if (!throwNext) return original(...args)
        throwNext = false
        throw new Error('refused before sending')
      }
      const read = await store.snapshot([PROBE])
      const input = (): AuthorizeInput => request(read.generation, Date.now(), { shard: S, nonce: { key: `ls:test:n:${randomUUID()}`, ttlSeconds: 60 } })
      const refused = Promise.all([store.authorize(input()), store.authorize(input())])
      await expect(refused).rejects.toThrow('refused before sending')
      expect((await store.authorize(input())).kind).toBe('ok')
    } finally {
      await store.close()
    }
  })

  test('a call Redis does not answer in time fails its requests, and the shard\'s next ones at once until it is answered; what it charged late is given back', async () => {
    const store = new RedisStore(TEST_REDIS_URL as string, { callTimeoutMs: 1000 })
    try {
      // The first call reaches Redis and runs, but its reply is held back, as over a stalled connection.
      const reply = holdingReplies(store)
      reply.holdNext()
      const acct = randomUUID()
      await store.loadBalance(acct, { epoch: 0, flushId: null, seq: 0 }, 5, false)
      const read = await store.snapshot([PROBE])
      const input = () => request(read.generation, Date.now(), { shard: S, charge: { accountId: acct, cost: 1, counter: null } })
      const started = performance.now()
      const silent = store.authorize(input())
      await Promise.resolve()
      // Waits for the silent call, then for nothing more: a reply behind it would not come sooner.
      const behind = store.authorize(input())
      await expect(silent).rejects.toThrow('did not answer')
      await expect(behind).rejects.toThrow('has not answered')
      expect(performance.now() - started).toBeLessThan(3000)
      const next = performance.now()
      await expect(store.authorize(input())).rejects.toThrow('has not answered')
      expect(performance.now() - next).toBeLessThan(100)
      // Redis did run and charge the silent call (read past the store, which fails its own reads at once
      // while a call is overdue); once its reply is in, that charge is given back.
      await expect(store.balance(acct)).rejects.toThrow('has not answered')
      expect(await store.redis.get(keys.balance(S, acct))).toBe('4')
      reply.deliver()
      expect(await until(() => store.redis.get(keys.balance(S, acct)), (balance) => balance === '5')).toBe('5')
      expect(await store.authorize(input())).toEqual(charged(1))
      expect(await store.balance(acct)).toBe(4)
    } finally {
      await store.close()
    }
  })

  test('an answer that came while the event loop stalled past the deadline is taken: the call is not overdue', async () => {
    const store = new RedisStore(TEST_REDIS_URL as string, { callTimeoutMs: 300 })
    try {
      const read = await store.snapshot([PROBE])
      const nonce = { key: `ls:test:n:${randomUUID()}`, ttlSeconds: 60 }
      const send = store.redis.lsAuthorize.bind(store.redis)
      store.redis.lsAuthorize = (...args: Parameters<typeof send>) => {
        const call = send(...args)
        // Once the call is sent and its deadline set, the loop is held as a long collection or a paused
        // host holds it, while Redis answers.
        queueMicrotask(() => {
          const until = performance.now() + 1000
          while (performance.now() < until) {}
        })
        return call
      }
      const answer = store.authorize(request(read.generation, Date.now(), { shard: S, nonce }))
      expect(await answer).toEqual(charged(0))
      store.redis.lsAuthorize = send
      // Nothing failed the shard's next request meanwhile either.
      expect(await store.authorize(request(read.generation, Date.now(), { shard: S }))).toEqual(charged(0))
    } finally {
      await store.close()
    }
  })

  test('a heartbeat answered as failed for want of a reply is uncounted too, so its repeat pays the charge it gave back', async () => {
    const store = new RedisStore(TEST_REDIS_URL as string, { callTimeoutMs: 300 })
    try {
      const reply = holdingReplies(store)
      const acct = randomUUID()
      await store.loadBalance(acct, { epoch: 0, flushId: null, seq: 0 }, 5, false)
      const read = await store.snapshot([PROBE])
      const counter = { key: `ls:test:hb:${randomUUID()}`, every: 2 }
      const heartbeat = () => store.authorize(request(read.generation, Date.now(), { shard: S, charge: { accountId: acct, cost: 1, counter } }))
      expect(await heartbeat()).toEqual(charged(0))
      // The second heartbeat, the charged one, runs but its reply comes after its deadline.
      reply.holdNext()
      await expect(heartbeat()).rejects.toThrow('did not answer')
      reply.deliver()
      expect(await until(() => store.redis.get(keys.balance(S, acct)), (balance) => balance === '5')).toBe('5')
      expect(await until(() => store.redis.get(counter.key), (count) => count === '1')).toBe('1')
      // The client repeats it: that repeat is the second counted heartbeat, and is charged.
      expect(await heartbeat()).toEqual(charged(1))
      expect(await store.balance(acct)).toBe(4)
    } finally {
      await store.close()
    }
  })
})
