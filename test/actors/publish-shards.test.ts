import { afterEach, beforeAll, expect, spyOn, test } from 'bun:test'
import { StateLoader } from '../../src/actors/load'
import { MemoryStore } from '../../src/store/memory'
import { allShards, keys, type Shard, shardOf } from '../../src/store/store'
import { makeTestApp, type TestApp } from '../support/helpers'
import { insertLicense } from '../support/client'

/** The in-process store spread over shards as a cluster's keys are (only the key names change). */
class ShardedStore extends MemoryStore {
  override readonly shards = 4
  override shardOf(accountId: string): Shard {
    return shardOf(accountId, 4)
  }
}

let t: TestApp
let store: ShardedStore

beforeAll(async () => {
  store = new ShardedStore()
  t = await makeTestApp({ store })
})

afterEach(() => {
  // bun's spies stay until restored.
  for (const spy of spies.splice(0)) spy.mockRestore()
})
const spies: { mockRestore(): void }[] = []

const revoke = (s: Awaited<ReturnType<TestApp['seed']>>, licenseKey: string) =>
  t.req('PUT', `/v1/licenses/${licenseKey}`, { apiKey: s.apiKey, body: { action: 'revoke' } })

const epochsInEveryShard = (licenseKey: string) => store.epochs(allShards(4).map((shard) => keys.licenseEpoch(shard, licenseKey)))

test("a change of an app this process never saw bumps the epoch in the app's shard only", async () => {
  const s = await t.seed()
  const licenseKey = await insertLicense(t.ctx, s.appId)
  expect((await revoke(s, licenseKey)).status).toBe(200)
  const own = allShards(4).indexOf(shardOf(s.accountId, 4))
  expect(await epochsInEveryShard(licenseKey)).toEqual(allShards(4).map((_, i) => (i === own ? 1 : 0)))
})

test("PostgreSQL cannot say the app's shard after a commit: the change still answers 200 and bumps every shard", async () => {
  const s = await t.seed()
  const licenseKey = await insertLicense(t.ctx, s.appId)
  spies.push(spyOn(StateLoader.prototype, 'accountOf').mockRejectedValue(new Error('connection lost')))
  const res = await revoke(s, licenseKey)
  expect(res.status, JSON.stringify(res.body)).toBe(200)
  expect(await epochsInEveryShard(licenseKey)).toEqual([1, 1, 1, 1])
})
