import { expect, test } from 'bun:test'
import { heapStats } from 'bun:jsc'
import { randomUUID } from 'node:crypto'
import { MemoryStore } from '../../src/store/memory'
import { keys, shardOf } from '../../src/store/store'
import { request } from './request'

const shard = shardOf('', 1)
const heapBytes = () => {
  Bun.gc(true)
  return heapStats().heapSize
}

test('the in-process store keeps license epochs in a table of fixed size: bumping 100,000 licenses costs no memory per license', async () => {
  const store = new MemoryStore()
  await store.bump([keys.licenseEpoch(shard, 'warm-up')])
  const before = heapBytes()
  const n = 100_000
  for (let i = 0; i < n; i += 1_000) await store.bump(Array.from({ length: 1_000 }, (_, j) => keys.licenseEpoch(shard, `K${i + j}-${randomUUID()}`)))
  // Each was about 200 bytes as an entry of the store's generic map (20 MB here).
  expect(heapBytes() - before).toBeLessThan(2_000_000)
  await store.close()
})

test("a bump makes the license's entry stale in authorize, and an epoch never comes back to a value it had", async () => {
  const store = new MemoryStore()
  const now = Date.parse('2031-01-01T00:00:00Z')
  const { generation } = await store.snapshot([])
  const key = keys.licenseEpoch(shard, 'K7QM-3XWT-9HFP-2RDN')
  const seen: number[] = []
  for (let i = 0; i < 3; i++) {
    const [epoch] = await store.epochs([key])
    expect(seen).not.toContain(epoch)
    seen.push(epoch!)
    expect((await store.authorize(request(generation, now, { epochs: [{ key, expected: epoch! }] }))).kind).toBe('ok')
    await store.bump([key])
    expect((await store.authorize(request(generation, now, { epochs: [{ key, expected: epoch! }] }))).kind).toBe('stale')
  }
  await store.close()
})
