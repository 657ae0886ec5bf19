import { expect, test } from 'bun:test'
import { MemoryStore } from '../../src/store/memory'
import { keys } from '../../src/store/store'
import { makeTestApp } from '../support/helpers'

/** A store whose bump fails while `down` is set, as Redis does during an outage. */
class FlakyStore extends MemoryStore {
  down = false
  override async bump(epochKeys: readonly string[]): Promise<void> {
    if (this.down) throw new Error('store unreachable')
    return super.bump(epochKeys)
  }
}

test('a committed change answers 200 while the store is down, and its invalidation lands once it is back', async () => {
  const store = new FlakyStore()
  const { req, seed } = await makeTestApp({ store })
  const s = await seed()
  const before = (await store.epochs([keys.appEpoch(store.shardOf(s.accountId), s.appId)]))[0]
  store.down = true
  const put = await req('PUT', `/v1/apps/${s.appId}/variables`, { apiKey: s.apiKey, body: { tier: 'pro' } })
  expect(put.status, JSON.stringify(put.body)).toBe(200)
  const stored = await req('GET', `/v1/apps/${s.appId}/variables`, { apiKey: s.apiKey })
  expect(stored.body).toEqual({ tier: 'pro' })
  expect((await store.epochs([keys.appEpoch(store.shardOf(s.accountId), s.appId)]))[0]).toBe(before)

  store.down = false
  const deadline = Date.now() + 5000
  while ((await store.epochs([keys.appEpoch(store.shardOf(s.accountId), s.appId)]))[0] === before && Date.now() < deadline) {
    await Bun.sleep(50)
  }
  expect((await store.epochs([keys.appEpoch(store.shardOf(s.accountId), s.appId)]))[0]).toBe((before ?? 0) + 1)
})
