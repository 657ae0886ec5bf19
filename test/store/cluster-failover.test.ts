/**
 * A Redis Cluster master fails over to a replica that missed a write (a revoke's epoch bump), and the
 * old master turns replica without closing the instances' connections to it: no connection drops, yet
 * what was read from the old master is suspect. Every instance notices the new master at its next call
 * to that shard and drops its cache, so the revoke is never served as valid.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import type { Redis } from 'ioredis'
import { RedisStore } from '../../src/store/redis'
import { keys } from '../../src/store/store'
import { hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp, MODE } from '../support/helpers'
import { ownReplicatedCluster } from '../support/redis-cluster'
import { until } from '../support/servers'

/** The replica stops taking its master's writes (it cannot authenticate to resync): a takeover then loses them. */
async function cutReplica(replica: Redis, master: Redis) {
  await replica.config('SET', 'masteruser', 'nobody')
  await replica.config('SET', 'masterauth', 'wrong')
  await master.client('KILL', 'TYPE', 'replica')
}

/** A replicated cluster of the describe's own, and one instance on it. */
async function instanceOnOwnCluster(masters: number, shards: number) {
  const cluster = await ownReplicatedCluster({ masters })
  const store = new RedisStore(cluster.url, { cluster: { shards } })
  const t = await makeTestApp({ store })
  afterAll(async () => {
    await store.close()
    await cluster.stop()
  })
  return { cluster, store, t }
}

// A cluster of the test's own and two instances on the shared PostgreSQL: the PostgreSQL pass only.
if (MODE === 'postgres') {
  describe('a failover to a replica that missed writes', async () => {
    const cluster = await ownReplicatedCluster()
    const stores = [0, 1].map(() => new RedisStore(cluster.url, { cluster: { shards: 4 } }))
    const [a, b] = [await makeTestApp({ store: stores[0]! }), await makeTestApp({ store: stores[1]! })]
    afterAll(async () => {
      for (const store of stores) await store.close()
      await cluster.stop()
    })

    test('a license revoked on one instance just before is refused by the other, which had it cached', async () => {
      const s = await a.seed({ credits: 1000 })
      const licenseKey = await insertLicense(a.ctx, s.appId, { unlimitedHwidSlots: true })
      const h = hwid()
      const validate = (on: typeof a) =>
        on.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: h, nonce: nonce() } })
      expect((await validate(b)).status).toBe(200)

      // The replica stops taking the master's writes, then the revoke.
      await cutReplica(cluster.replica, cluster.master)
      const revoked = await a.req('PUT', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey, body: { action: 'revoke' } })
      expect(revoked.status, JSON.stringify(revoked.body)).toBe(200)
      await cluster.replica.cluster('FAILOVER', 'TAKEOVER')
      await until(() => cluster.master.info('replication'), (info) => info.includes('role:slave'), 10_000)

      // A call that meets the new master is not trusted (it fails as in an outage); after it, the cache is gone.
      const answers: unknown[] = []
      const settled = await until(async () => {
        const res = await validate(b)
        answers.push(res.body)
        return res.body
      }, (body) => body.error !== 'system_error', 10_000)
      expect(settled).toEqual({ status: 'failed', error: 'revoked' })
      expect(answers.filter((body) => (body as { status?: string }).status === 'success')).toEqual([])
    })
  })

  describe('a charge the replica missed', async () => {
    const { cluster, store, t } = await instanceOnOwnCluster(1, 4)

    test('is not given back by the replica that took over: its refund would be a credit never paid', async () => {
      const s = await t.seed({ credits: 10 })
      const licenseKey = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
      const validate = () => t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() } })
      expect((await validate()).status).toBe(200)
      await t.ctx.credits.flush()
      const reconciled = await t.ctx.credits.currentBalance(s.accountId)
      expect(reconciled).toBe(9)

      await cutReplica(cluster.replica, cluster.master)
      const charge = await t.ctx.credits.charge(s.accountId, 1, t.ctx.clock())
      expect(charge).not.toBeNull()
      const epoch = keys.appEpoch(store.shardOf(s.accountId), s.appId)
      const { generation } = await store.snapshot([epoch])
      await cluster.replica.cluster('FAILOVER', 'TAKEOVER')
      await until(() => cluster.master.info('replication'), (info) => info.includes('role:slave'), 10_000)
      // The instance sees the new master at its next read of the shard.
      await until(() => store.snapshot([epoch]).then((seen) => seen.generation, () => generation), (now) => now !== generation, 10_000)

      await t.ctx.credits.refund(s.accountId, 1, charge!.chargedUnder)
      await t.ctx.credits.flush()
      expect(await t.ctx.credits.currentBalance(s.accountId)).toBe(reconciled)
    })
  })

  describe('two masters taken over one after the other', async () => {
    const { cluster, store, t } = await instanceOnOwnCluster(2, 16)

    test("the second shard's takeover still drops the refund of a charge its replica missed", async () => {
      const slotOf = async (s: { accountId: string }) => Number(await cluster.master.cluster('KEYSLOT', keys.generation(store.shardOf(s.accountId))))
      // One account on each master (the first serves slots 0-8191).
      let a = await t.seed({ credits: 10 })
      while ((await slotOf(a)) > 8191) a = await t.seed({ credits: 10 })
      let b = await t.seed({ credits: 10 })
      while ((await slotOf(b)) <= 8191) b = await t.seed({ credits: 10 })
      for (const s of [a, b]) {
        const licenseKey = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
        const res = await t.req('POST', '/auth/validate', { body: { appId: s.appId, appSecret: s.appSecret, licenseKey, hwid: hwid(), nonce: nonce() } })
        expect(res.status).toBe(200)
      }
      await t.ctx.credits.flush()
      expect(await t.ctx.credits.currentBalance(b.accountId)).toBe(9)

      for (const [i, replica] of cluster.replicas.entries()) await cutReplica(replica, cluster.masters[i]!)
      const charge = await t.ctx.credits.charge(b.accountId, 1, t.ctx.clock())
      expect(charge).not.toBeNull()
      const [epochA, epochB] = [a, b].map((s) => keys.appEpoch(store.shardOf(s.accountId), s.appId)) as [string, string]
      await store.snapshot([epochA])
      const { generation } = await store.snapshot([epochB])
      for (const i of [1, 0]) {
        await cluster.replicas[i]!.cluster('FAILOVER', 'TAKEOVER')
        await until(() => cluster.masters[i]!.info('replication'), (info) => info.includes('role:slave'), 10_000)
      }
      // a's shard shows its new master first; b's is read after.
      await until(() => store.snapshot([epochA]).then((seen) => seen.generation, () => generation), (now) => now !== generation, 10_000)
      await until(() => store.snapshot([epochB]).then(() => true, () => false), (read) => read, 10_000)

      await t.ctx.credits.refund(b.accountId, 1, charge!.chargedUnder)
      await t.ctx.credits.flush()
      expect(await t.ctx.credits.currentBalance(b.accountId)).toBe(9)
    }, 60_000)
  })
}
