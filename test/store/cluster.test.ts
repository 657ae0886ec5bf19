/**
 * Two service instances on one PostgreSQL and a 3-master Redis Cluster of the test's own: every
 * cross-instance invariant holds with the accounts' keys spread over the masters, and a master that
 * loses its data is noticed.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { eq } from 'drizzle-orm'
import type { Redis } from 'ioredis'
import { accounts, licenses } from '../../src/db/schema'
import { openStore, RedisStore } from '../../src/store/redis'
import { clusterSeeds } from '../../src/store/redis/connection'
import { allShards, keys, shardOfKey, type Store } from '../../src/store/store'
import { decode, hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp, MODE, type TestApp } from '../support/helpers'
import { type OwnRedisCluster, ownRedisCluster } from '../support/redis-cluster'
import { freePort, ownRedis, until } from '../support/servers'
import { loggedBy } from '../support/log-capture'
import { setLogLevel } from '../../src/lib/log'

const SHARDS = 64

/** Moves a slot's keys from one master to another as `redis-cli --cluster reshard` does. */
async function moveSlotOf(cluster: OwnRedisCluster, slot: number, from: Redis, to: Redis) {
  const [fromId, toId] = [String(await from.cluster('MYID')), String(await to.cluster('MYID'))]
  const toPort = cluster.ports[cluster.nodes.indexOf(to)]!
  await to.cluster('SETSLOT', slot, 'IMPORTING', fromId)
  await from.cluster('SETSLOT', slot, 'MIGRATING', toId)
  for (;;) {
    const moving = (await from.cluster('GETKEYSINSLOT', slot, 100)) as string[]
    if (moving.length === 0) break
    await from.migrate('127.0.0.1', toPort, '', 0, 5_000, 'KEYS', ...moving)
  }
  for (const node of [to, from, ...cluster.nodes.filter((n) => n !== to && n !== from)]) await node.cluster('SETSLOT', slot, 'NODE', toId)
}

test('seed nodes are read as ioredis connects to them: an IPv6 address without its brackets', () => {
  expect(clusterSeeds('redis://[::1]:7000, rediss://user:pw@[2001:db8::5],redis://node-a:7001')).toEqual([
    { host: '::1', port: 7000 },
    { host: '2001:db8::5', port: 6379 },
    { host: 'node-a', port: 7001 },
  ])
})

const body = (s: { appId: string; appSecret: string }, licenseKey: string, h = hwid()) => ({
  appId: s.appId,
  appSecret: s.appSecret,
  licenseKey,
  hwid: h,
  nonce: nonce(),
})

// A cluster of the test's own and two instances on the shared PostgreSQL: the PostgreSQL pass only.
if (MODE === 'postgres') {
  describe('two instances on a 3-master Redis Cluster', async () => {
    const cluster = await ownRedisCluster()
    const stores: RedisStore[] = []
    const instance = async (env: Record<string, string> = {}): Promise<TestApp> => {
      const store = new RedisStore(cluster.url, { cluster: { shards: SHARDS } })
      stores.push(store)
      return makeTestApp({ store, env })
    }
    const [a, b] = [await instance(), await instance()]
    afterAll(async () => {
      for (const store of stores) await store.close()
      await cluster.stop()
    })
    const on = [a, b]
    const validate = (i: number, body: Record<string, unknown>) => on[i % 2]!.req('POST', '/auth/validate', { body })

    /** The master serving a key's slot, by its index in cluster.nodes. */
    const slotOwners = async () => {
      const ranges = (await cluster.nodes[0]!.cluster('SLOTS')) as unknown as [number, number, [string, number]][]
      return (slot: number) => cluster.ports.indexOf(ranges.find(([from, to]) => slot >= from && slot <= to)![2][1])
    }
    const nodeOf = async (key: string) => (await slotOwners())(Number(await cluster.nodes[0]!.cluster('KEYSLOT', key)))

    test('a cluster whose masters evict keys when full is warned of at start', async () => {
      setLogLevel('warn')
      try {
        for (const node of cluster.nodes) await node.config('SET', 'maxmemory-policy', 'allkeys-lru')
        const logged = await loggedBy(async () => (await openStore(cluster.url, SHARDS)).close())
        expect(logged.filter((entry) => entry.level === 'warn').map((entry) => entry.msg)).toEqual([
          'redis evicts keys when it is full (maxmemory-policy allkeys-lru): evicted nonces let validates be replayed and evicted charges go unbilled; set maxmemory-policy noeviction',
        ])
      } finally {
        for (const node of cluster.nodes) await node.config('SET', 'maxmemory-policy', 'noeviction')
        setLogLevel('error')
      }
      const logged = await loggedBy(async () => (await openStore(cluster.url, SHARDS)).close())
      expect(logged.filter((entry) => entry.level === 'warn')).toEqual([])
    })

    test('an instance with another shard count than the store was written with refuses to start', async () => {
      const opened = await openStore(cluster.url, SHARDS)
      await opened.close()
      await expect(openStore(cluster.url, SHARDS / 2)).rejects.toThrow(`written with ${SHARDS} shard(s) and this instance uses ${SHARDS / 2}`)
    })

    test('the default shards spread evenly over 3 masters', async () => {
      const owner = await slotOwners()
      const perNode = [0, 0, 0]
      for (const shard of allShards(SHARDS)) perNode[owner(Number(await cluster.nodes[0]!.cluster('KEYSLOT', keys.generation(shard))))]!++
      expect(Math.min(...perNode)).toBeGreaterThanOrEqual(18)
    })

    test('40 HWIDs racing at a 3-seat key through both instances bind exactly 3', async () => {
      const s = await a.seed({ credits: 1000 })
      const licenseKey = await insertLicense(a.ctx, s.appId, { maxHwidSlots: 3 })
      const results = await Promise.all(Array.from({ length: 40 }, (_, i) => validate(i, body(s, licenseKey))))
      expect(results.filter((r) => r.status === 200)).toHaveLength(3)
      expect(results.filter((r) => r.body.error === 'hwid_mismatch')).toHaveLength(37)
      const [row] = await a.ctx.database.db.select().from(licenses).where(eq(licenses.key, licenseKey))
      expect(row?.hwids).toHaveLength(3)
    })

    test('N credits pay for exactly N validates across instances, and the reconciler moves them to PostgreSQL', async () => {
      const s = await a.seed({ credits: 7 })
      const licenseKey = await insertLicense(a.ctx, s.appId, { unlimitedHwidSlots: true })
      const results = await Promise.all(Array.from({ length: 20 }, (_, i) => validate(i, body(s, licenseKey))))
      expect(results.filter((r) => r.status === 200)).toHaveLength(7)
      expect(results.filter((r) => r.body.error === 'no_credits')).toHaveLength(13)
      expect(await a.ctx.store.balance(s.accountId)).toBe(0)
      expect(await b.ctx.store.dirtyAccounts(b.ctx.store.shardOf(s.accountId))).toContain(s.accountId)
      await b.ctx.credits.flush()
      const [row] = await a.ctx.database.db.select({ credits: accounts.credits }).from(accounts).where(eq(accounts.id, s.accountId))
      expect(row?.credits).toBe(0)
      expect(await a.ctx.store.dirtyAccounts(a.ctx.store.shardOf(s.accountId))).not.toContain(s.accountId)
      expect((await validate(0, body(s, licenseKey))).body.error).toBe('no_credits')
    })

    test('a master that stops answering in the middle of a credit flush holds up its own shards only, and the reconciler stops without it', async () => {
      // Accounts until one's shard is on the first master and another's on another master.
      let stalled: Awaited<ReturnType<typeof a.seed>> | undefined
      let healthy: typeof stalled
      while (!stalled || !healthy) {
        const s = await a.seed({ credits: 5 })
        if ((await nodeOf(keys.dirtyAccounts(a.ctx.store.shardOf(s.accountId)))) === 0) stalled ??= s
        else healthy ??= s
      }
      for (const s of [stalled, healthy]) {
        const licenseKey = await insertLicense(a.ctx, s.appId, { unlimitedHwidSlots: true })
        for (let i = 0; i < 2; i++) expect((await validate(i, body(s, licenseKey))).status).toBe(200)
      }
      const reconciled = async (accountId: string) =>
        (await a.ctx.database.db.select({ credits: accounts.credits }).from(accounts).where(eq(accounts.id, accountId)))[0]?.credits

      // The first master stops once its shard's dirty set is read: the flush's begin waits on it, inside
      // the flush's transaction, until the store call's deadline; that shard's pass then ends, and the
      // next ones meet the deadline at their first call.
      const store = b.ctx.store
      const dirtyAccounts = store.dirtyAccounts.bind(store)
      let stopped = false
      store.dirtyAccounts = async (shard) => {
        const dirty = await dirtyAccounts(shard)
        // Once: a read the stopped master answers after SIGCONT would stop it again.
        if (!stopped && dirty.includes(stalled.accountId)) {
          stopped = true
          process.kill(cluster.pids[0]!, 'SIGSTOP')
        }
        return dirty
      }
      try {
        const reconciler = b.ctx.credits.startReconciler(50, 1_000)
        expect(await until(() => reconciled(healthy.accountId), (credits) => credits === 3, 8_000)).toBe(3)
        expect(await reconciled(stalled.accountId)).toBe(5)
        const stopping = performance.now()
        await reconciler.stop()
        expect(performance.now() - stopping).toBeLessThan(3_000)
      } finally {
        store.dirtyAccounts = dirtyAccounts
        process.kill(cluster.pids[0]!, 'SIGCONT')
      }
      // The master runs the begin late: it files the charges under its flush id, which the next pass applies, once.
      expect(await until(() => reconciled(stalled.accountId), (credits) => credits === 3)).toBe(3)
      await b.ctx.credits.flush()
      expect(await reconciled(stalled.accountId)).toBe(3)
    })

    test('a nonce used on one instance is a replay on the other', async () => {
      const s = await a.seed()
      const licenseKey = await insertLicense(a.ctx, s.appId, { unlimitedHwidSlots: true })
      const once = body(s, licenseKey)
      expect((await validate(0, once)).status).toBe(200)
      expect((await validate(1, once)).body.error).toBe('replay_detected')
    })

    test('the per-license limit is one bucket for both instances', async () => {
      const env = { VALIDATE_LIMIT_PER_LICENSE: '5' }
      const limited = [await instance(env), await instance(env)]
      const s = await a.seed()
      const licenseKey = await insertLicense(a.ctx, s.appId, { unlimitedHwidSlots: true })
      const statuses: number[] = []
      for (let i = 0; i < 8; i++) statuses.push((await limited[i % 2]!.req('POST', '/auth/validate', { body: body(s, licenseKey) })).status)
      expect(statuses).toEqual([200, 200, 200, 200, 200, 429, 429, 429])
    })

    test('a revoke on one instance is refused on the other at its next request', async () => {
      const s = await a.seed()
      const licenseKey = await insertLicense(a.ctx, s.appId)
      const h = hwid()
      const v = await validate(1, body(s, licenseKey, h))
      expect(v.status).toBe(200)
      const token = decode(v.body.payload).sessionToken
      const beat = () => b.req('POST', '/auth/heartbeat', { body: { appId: s.appId, sessionToken: token, hwid: h } })
      expect((await beat()).status).toBe(200)
      const put = await a.req('PUT', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey, body: { action: 'revoke' } })
      expect(put.status).toBe(200)
      expect((await beat()).body.error).toBe('revoked')
      expect((await validate(1, body(s, licenseKey, h))).body.error).toBe('revoked')
    })

    test("the keys of many accounts spread over all 3 masters, each account's keys on one of them", async () => {
      const seen = new Set<number>()
      for (let i = 0; i < 60 && seen.size < 3; i++) {
        const s = await a.seed()
        const licenseKey = await insertLicense(a.ctx, s.appId, { unlimitedHwidSlots: true })
        expect((await validate(i, body(s, licenseKey))).status).toBe(200)
        seen.add(await nodeOf(keys.balance(a.ctx.store.shardOf(s.accountId), s.accountId)))
      }
      expect(seen.size).toBe(3)
      // Every client-request key of every node carries a shard tag, and a tag's keys live on one node.
      const nodesOfShard = new Map<string, Set<number>>()
      for (const [i, node] of cluster.nodes.entries()) {
        const names = await node.keys('ls:*')
        expect(names.length).toBeGreaterThan(0)
        for (const name of names) {
          // The two kinds of key no client request touches: the Developer API limits, the shard count.
          if (name.startsWith('ls:rl:api:') || name === keys.shardCount) continue
          const shard = shardOfKey(name)
          expect(shard).not.toBe('')
          nodesOfShard.set(shard!, (nodesOfShard.get(shard!) ?? new Set()).add(i))
        }
      }
      for (const nodes of nodesOfShard.values()) expect(nodes.size).toBe(1)
    })

    test('an authorize call that meets its slot being migrated fails before it writes anything', async () => {
      const store = a.ctx.store
      const shard = store.shardOf('acct-migrating')
      const appEpoch = keys.appEpoch(shard, 'app-migrating')
      // Every key the script read before its first write exists on the source: only the new nonce does not.
      await store.bump([appEpoch])
      const { generation, epochs: [epoch] } = await store.snapshot([appEpoch])
      const ceiling = { key: keys.daily(shard, 'app-migrating', '2030-01-01'), limit: 1000, ttlSeconds: 3600 }
      const request = (n: string) => ({
        nowMs: Date.now(),
        shard,
        generation,
        epochs: [{ key: appEpoch, expected: epoch! }],
        ceiling,
        buckets: [{ key: keys.bucket(shard, 'v:ip:app-migrating', '10.0.0.9'), capacity: 100, refillPerSecond: 10 }],
        nonce: { key: keys.nonce(shard, 'app-migrating', n), ttlSeconds: 60 },
        deny: false,
        charge: null,
      })
      expect((await store.authorize(request('first'))).kind).toBe('ok')
      const slot = Number(await cluster.nodes[0]!.cluster('KEYSLOT', appEpoch))
      const from = cluster.nodes[await nodeOf(appEpoch)]!
      const to = cluster.nodes.find((node) => node !== from)!
      const [fromId, toId] = [String(await from.cluster('MYID')), String(await to.cluster('MYID'))]
      await to.cluster('SETSLOT', slot, 'IMPORTING', fromId)
      await from.cluster('SETSLOT', slot, 'MIGRATING', toId)
      try {
        // The new nonce key is not on the source any more as far as Redis knows: the call fails as a whole.
        await expect(store.authorize(request('during'))).rejects.toThrow()
        expect(await from.get(ceiling.key)).toBe('1')
      } finally {
        await to.cluster('SETSLOT', slot, 'STABLE')
        await from.cluster('SETSLOT', slot, 'STABLE')
      }
      expect(await from.exists(keys.nonce(shard, 'app-migrating', 'during'))).toBe(0)
      expect((await store.authorize(request('after'))).kind).toBe('ok')
      expect(await from.get(ceiling.key)).toBe('2')
    })

    test('a master that loses its data is noticed: every cached entry goes, nothing stale is served', async () => {
      const s = await a.seed()
      const licenseKey = await insertLicense(a.ctx, s.appId, { unlimitedHwidSlots: true })
      const h = hwid()
      expect((await a.req('POST', '/auth/validate', { body: body(s, licenseKey, h) })).status).toBe(200)
      const other = await b.seed()
      const otherKey = await insertLicense(b.ctx, other.appId, { unlimitedHwidSlots: true })
      expect((await a.req('POST', '/auth/validate', { body: body(other, otherKey) })).status).toBe(200)
      const before = a.ctx.actors.generation
      // The license's epoch was never bumped (0, as after a loss): only the shard's generation tells
      // that the entry cached above may predate a change whose bump the lost data held.
      await cluster.nodes[await nodeOf(keys.generation(a.ctx.store.shardOf(s.accountId)))]!.flushall()
      await a.ctx.database.db.update(licenses).set({ status: 'revoked' }).where(eq(licenses.key, licenseKey))
      expect((await a.req('POST', '/auth/validate', { body: body(s, licenseKey, h) })).body.error).toBe('revoked')
      expect(a.ctx.actors.generation).toBeGreaterThan(before)
      // The whole registry started over, the other account's entries with it.
      expect(a.ctx.actors.cachedLicense(other.appId, otherKey)).toBeUndefined()
      expect((await b.req('POST', '/auth/validate', { body: body(s, licenseKey, h) })).body.error).toBe('revoked')
    })
  })

  test("a cluster that refuses REDIS_URL's credentials stops the start, naming them", async () => {
    const cluster = await ownRedisCluster()
    try {
      for (const node of cluster.nodes) await node.config('SET', 'requirepass', 's3cret')
      const seeds = (auth: string) => cluster.ports.map((port) => `redis://${auth}127.0.0.1:${port}`).join(',')
      for (const auth of [':wrong@', '']) {
        await expect(openStore(seeds(auth), SHARDS, 3_000)).rejects.toThrow("this Redis Cluster refuses REDIS_URL's credentials")
        // The first seed down: another one answers for it (its credentials are the first URL's).
        const unheard = `redis://${auth}127.0.0.1:${await freePort()},${seeds('')}`
        await expect(openStore(unheard, SHARDS, 3_000)).rejects.toThrow("this Redis Cluster refuses REDIS_URL's credentials")
      }
      const store = await openStore(seeds(':s3cret@'), SHARDS, 3_000)
      expect(await store.ping()).toBe(true)
      await store.close()
    } finally {
      await cluster.stop()
    }
  }, 60_000)

  test('a cluster node named as one Redis, or one Redis named as a cluster, stops the start, naming the setting', async () => {
    const cluster = await ownRedisCluster()
    const single = await ownRedis()
    try {
      await expect(openStore(cluster.url.split(',')[0]!, null, 3_000)).rejects.toThrow('REDIS_URL names a node of a Redis Cluster: set REDIS_CLUSTER=true')
      await expect(openStore(single.url, SHARDS, 3_000)).rejects.toThrow('REDIS_CLUSTER=true, but REDIS_URL names a Redis that is not in cluster mode')
    } finally {
      await single.stop()
      await cluster.stop()
    }
  }, 60_000)

  // A cluster of its own: its first master is killed for good.
  describe('a master down when an instance starts', async () => {
    const cluster = await ownRedisCluster()
    const first = new RedisStore(cluster.url, { cluster: { shards: SHARDS } })
    const t = await makeTestApp({ store: first, env: { PUBLIC_RATE_LIMITS: 'false' } })
    let later: Store | undefined
    afterAll(async () => {
      await first.close()
      await later?.close()
      await cluster.stop()
    })

    test("holds up its own shards only, whichever master it is: the other masters' tenants are served by the new instance", async () => {
      expect(await first.checkShardCount(3_000)).toBe(true)
      const ranges = (await cluster.nodes[0]!.cluster('SLOTS')) as unknown as [number, number, [string, number]][]
      const nodeOf = async (key: string) => {
        const slot = Number(await cluster.nodes[0]!.cluster('KEYSLOT', key))
        return cluster.ports.indexOf(ranges.find(([from, to]) => slot >= from && slot <= to)![2][1])
      }
      // The master holding the record instances before the per-shard ones wrote alone.
      const down = await nodeOf(keys.shardCount)
      let up: (Awaited<ReturnType<typeof t.seed>> & { licenseKey: string }) | undefined
      while (!up) {
        const s = await t.seed({ credits: 1_000 })
        if ((await nodeOf(keys.generation(first.shardOf(s.accountId)))) !== down) {
          up = { ...s, licenseKey: await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true }) }
        }
      }
      const tenant = up
      for (const [i, node] of cluster.nodes.entries()) if (i !== down) await node.config('SET', 'cluster-require-full-coverage', 'no')
      process.kill(cluster.pids[down]!, 'SIGKILL')
      await Bun.sleep(500)
      later = await openStore(cluster.url, SHARDS, 3_000)
      const second = await makeTestApp({ store: later, env: { PUBLIC_RATE_LIMITS: 'false' } })
      const res = await until(() => second.req('POST', '/auth/validate', { body: body(tenant, tenant.licenseKey) }), (r) => r.status === 200, 5_000)
      expect(res.status, JSON.stringify(res.body)).toBe(200)
    })
  })

  describe('a master that stays down', async () => {
    const cluster = await ownRedisCluster()
    const store = new RedisStore(cluster.url, { cluster: { shards: SHARDS } })
    const t = await makeTestApp({ store, env: { PUBLIC_RATE_LIMITS: 'false' } })
    const warmUp = t.ctx.actors.startWarmUp()
    afterAll(async () => {
      await warmUp.stop()
      await store.close()
      await cluster.stop()
    })

    test("fails its own shards' calls only: the other masters' tenants are answered throughout", async () => {
      const ranges = (await cluster.nodes[1]!.cluster('SLOTS')) as unknown as [number, number, [string, number]][]
      const nodeOf = async (key: string) => {
        const slot = Number(await cluster.nodes[1]!.cluster('KEYSLOT', key))
        return cluster.ports.indexOf(ranges.find(([from, to]) => slot >= from && slot <= to)![2][1])
      }
      type Tenant = Awaited<ReturnType<typeof t.seed>> & { licenseKey: string }
      let down: Tenant | undefined
      let up: Tenant | undefined
      while (!down || !up) {
        const s = await t.seed({ credits: 100_000 })
        const tenant = { ...s, licenseKey: await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true }) }
        if ((await nodeOf(keys.generation(store.shardOf(s.accountId)))) === 0) down ??= tenant
        else up ??= tenant
      }
      const validate = (s: Tenant) => t.req('POST', '/auth/validate', { body: body(s, s.licenseKey) })
      for (const s of [down, up]) expect((await validate(s)).status).toBe(200)
      // The others go on serving their slots without the first master's.
      for (const node of cluster.nodes.slice(1)) await node.config('SET', 'cluster-require-full-coverage', 'no')
      await warmUp.idle()
      process.kill(cluster.pids[0]!, 'SIGKILL')
      // What was in flight at the kill fails with it; what comes after must not.
      await Bun.sleep(300)
      const answers: Record<'up' | 'down', string[]> = { up: [], down: [] }
      const end = Date.now() + 3_000
      const traffic = async (name: 'up' | 'down', s: Tenant) => {
        while (Date.now() < end) {
          const res = await validate(s)
          answers[name].push(`${res.status} ${res.body.error ?? ''}`.trim())
        }
      }
      // Readiness holds on every instance alike: out of a load balancer they would fail the others too.
      const readiness: number[] = []
      const probes = async () => {
        while (Date.now() < end) {
          readiness.push((await t.req('GET', '/readyz')).status)
          await Bun.sleep(20)
        }
      }
      await Promise.all([traffic('up', up), traffic('up', up), traffic('down', down), probes()])
      expect(answers.down.some((answer) => answer !== '200')).toBe(true)
      expect(answers.up.length).toBeGreaterThan(20)
      expect(new Set(answers.up)).toEqual(new Set(['200']))
      expect(readiness.length).toBeGreaterThan(20)
      expect(new Set(readiness)).toEqual(new Set([200]))
    })
  })

  // A cluster of its own, as Redis sets one up by default: a master down makes the whole cluster refuse.
  describe('a master down in a cluster that requires full coverage', async () => {
    const cluster = await ownRedisCluster()
    const store = new RedisStore(cluster.url, { cluster: { shards: SHARDS } })
    const t = await makeTestApp({ store })
    afterAll(async () => {
      await store.close()
      await cluster.stop()
    })

    test('readiness says the store failed once the cluster refuses every key, and ok again when it serves', async () => {
      expect(await store.checkShardCount(3_000)).toBe(true)
      expect((await t.req('GET', '/readyz')).status).toBe(200)
      for (const node of cluster.nodes) await node.config('SET', 'cluster-node-timeout', '500')
      process.kill(cluster.pids[0]!, 'SIGSTOP')
      try {
        const survivor = cluster.nodes[1]!
        await until(() => survivor.cluster('INFO'), (info) => String(info).includes('cluster_state:fail'), 10_000)
        const res = await t.req('GET', '/readyz')
        expect([res.status, res.body.store]).toEqual([503, 'failed'])
      } finally {
        process.kill(cluster.pids[0]!, 'SIGCONT')
      }
      const back = await until(() => t.req('GET', '/readyz'), (r) => r.status === 200, 10_000)
      expect(back.status).toBe(200)
    })
  })

  // A cluster of its own: one shard's slot goes back and forth between two masters.
  describe('a reshard under load', async () => {
    const cluster = await ownRedisCluster()
    const store = new RedisStore(cluster.url, { cluster: { shards: SHARDS } })
    const t = await makeTestApp({ store, env: { PUBLIC_RATE_LIMITS: 'false' } })
    afterAll(async () => {
      await store.close()
      await cluster.stop()
    })

    const moveSlot = (slot: number, from: Redis, to: Redis) => moveSlotOf(cluster, slot, from, to)

    test("charges exactly the successes, of the moved shard's tenant and of the others'", async () => {
      const ranges = async () => (await cluster.nodes[0]!.cluster('SLOTS')) as unknown as [number, number, [string, number]][]
      const slotOf = async (s: { accountId: string }) => Number(await cluster.nodes[0]!.cluster('KEYSLOT', keys.generation(store.shardOf(s.accountId))))
      type Tenant = Awaited<ReturnType<typeof t.seed>> & { licenseKey: string }
      const credits = 100_000
      const tenant = async (): Promise<Tenant> => {
        const s = await t.seed({ credits })
        return { ...s, licenseKey: await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true }) }
      }
      const moved = await tenant()
      const slot = await slotOf(moved)
      const nodeOf = async (s: Tenant) => {
        const at = await slotOf(s)
        return cluster.nodes[cluster.ports.indexOf((await ranges()).find(([from, to]) => at >= from && at <= to)![2][1])]!
      }
      const home = await nodeOf(moved)
      // The other tenant's master, where the slot goes, is one the instance has read from: a move to a
      // master it never read from is taken for a failover (Connection.#checkMaster).
      let other = await tenant()
      while ((await nodeOf(other)) === home) other = await tenant()
      const away = await nodeOf(other)

      const successes = new Map<string, number>([[moved.accountId, 0], [other.accountId, 0]])
      let loading = true
      const load = async (s: Tenant) => {
        while (loading) {
          const res = await t.req('POST', '/auth/validate', { body: body(s, s.licenseKey) })
          if (res.status === 200) successes.set(s.accountId, successes.get(s.accountId)! + 1)
        }
      }
      const clients = [moved, other].flatMap((s) => Array.from({ length: 8 }, () => load(s)))
      for (let round = 0; round < 6; round++) {
        await Bun.sleep(150)
        await moveSlot(slot, round % 2 === 0 ? home : away, round % 2 === 0 ? away : home)
      }
      await Bun.sleep(150)
      loading = false
      await Promise.all(clients)

      for (const s of [moved, other]) {
        expect(successes.get(s.accountId)!).toBeGreaterThan(50)
        // Refunds go out after their callers are answered.
        const spent = await until(async () => credits - ((await store.balance(s.accountId)) ?? credits), (n) => n === successes.get(s.accountId), 5_000)
        expect(spent).toBe(successes.get(s.accountId)!)
      }
    }, 60_000)
  })

  // A cluster of its own with a master holding no slot yet: a scale-out, then a scale-in.
  describe('a reshard onto a new master, and one that empties a master', async () => {
    const cluster = await ownRedisCluster({ empty: 1 })
    const store = new RedisStore(cluster.url, { cluster: { shards: SHARDS } })
    const t = await makeTestApp({ store })
    afterAll(async () => {
      await store.close()
      await cluster.stop()
    })
    const [first, second] = cluster.nodes as [Redis, Redis]
    const added = cluster.nodes[3]!
    const slotOf = async (shard: string) => Number(await first.cluster('KEYSLOT', keys.generation(shard)))
    const ownerOf = async (shard: string) => {
      const slot = await slotOf(shard)
      const ranges = (await first.cluster('SLOTS')) as unknown as [number, number, [string, number]][]
      return cluster.nodes[cluster.ports.indexOf(ranges.find(([from, to]) => slot >= from && slot <= to)![2][1])]
    }
    /**
     * An account of the first master's, whose charge made now is refunded after what `reshard` does and
     * the reads of the shards it names, made at once, as under load.
     */
    const refundAfter = async (reshard: (kept: string) => Promise<string[]>) => {
      let s = await t.seed({ credits: 10 })
      while ((await ownerOf(store.shardOf(s.accountId))) !== first) s = await t.seed({ credits: 10 })
      const licenseKey = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
      expect((await t.req('POST', '/auth/validate', { body: body(s, licenseKey) })).status).toBe(200)
      await t.ctx.credits.flush()
      const before = await t.ctx.credits.currentBalance(s.accountId)
      const charge = await t.ctx.credits.charge(s.accountId, 1, t.ctx.clock())
      expect(charge).not.toBeNull()
      const read = await reshard(store.shardOf(s.accountId))
      const readAll = () => Promise.all(read.map((shard) => store.snapshot([keys.appEpoch(shard, 'probe')]).catch(() => null)))
      await readAll()
      // ioredis's refresh of its table, which the first MOVED began.
      await Bun.sleep(1_000)
      await readAll()
      await t.ctx.credits.refund(s.accountId, 1, charge!.chargedUnder)
      await t.ctx.credits.flush()
      return { before, after: await t.ctx.credits.currentBalance(s.accountId) }
    }

    test("a slot moved to the new master leaves the refunds of the shards that stay on the old one", async () => {
      const { before, after } = await refundAfter(async (kept) => {
        // Every shard read once, so the first master's are recorded where they are.
        await Promise.all(allShards(SHARDS).map((shard) => store.snapshot([keys.appEpoch(shard, 'probe')])))
        let moved: string | undefined
        for (const shard of allShards(SHARDS)) if (!moved && shard !== kept && (await ownerOf(shard)) === first) moved = shard
        await moveSlotOf(cluster, await slotOf(moved!), first, added)
        // In one pipeline to the first master: the moved shard's MOVED, then the kept one's reply.
        return [moved!, kept]
      })
      expect(after).toBe(before)
    }, 60_000)

    test("a reshard that empties a master gives the refunds of its shards back: their keys moved whole", async () => {
      const ownersBefore = new Map<string, Redis | undefined>()
      const { before, after } = await refundAfter(async (kept) => {
        // Every master read from, so the moves go to one the instance knows.
        await Promise.all(allShards(SHARDS).map((shard) => store.snapshot([keys.appEpoch(shard, 'probe')])))
        for (const shard of allShards(SHARDS)) ownersBefore.set(shard, await ownerOf(shard))
        const [fromId, toId] = [String(await first.cluster('MYID')), String(await second.cluster('MYID'))]
        const owned = ((await first.cluster('SLOTS')) as unknown as [number, number, [string, number]][])
          .filter(([, , [, port]]) => port === cluster.ports[0])
          .reduce((n, [from, to]) => n + to - from + 1, 0)
        const reshard = Bun.spawnSync(['redis-cli', '--cluster', 'reshard', `127.0.0.1:${cluster.ports[1]}`, '--cluster-from', fromId,
          '--cluster-to', toId, '--cluster-slots', String(owned), '--cluster-yes'])
        expect(reshard.exitCode, reshard.stderr.toString()).toBe(0)
        // Another shard that was the first master's: its MOVED begins the refresh that finds the first
        // master holding no slot, before the kept shard is read again.
        return [allShards(SHARDS).find((shard) => shard !== kept && ownersBefore.get(shard) === first)!]
      })
      expect(after).toBe(before)
    }, 120_000)
  })
}
