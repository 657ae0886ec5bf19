import { expect, test } from 'bun:test'
import { existsSync } from 'node:fs'
import { type CpuTimes, HostLoad } from '../src/webhooks/load'

test('the host counts as saturated from the busy share of the last interval, read at most once per interval', async () => {
  let now: CpuTimes = { busy: 0, total: 0 }
  let reads = 0
  const load = new HostLoad(0.7, 20, () => {
    reads++
    return now
  })
  expect(load.saturated()).toBe(false)
  now = { busy: 80, total: 100 }
  // Within the interval the last answer stands, without reading.
  expect(load.saturated()).toBe(false)
  expect(reads).toBe(1)
  await Bun.sleep(25)
  expect(load.saturated()).toBe(true)
  now = { busy: 80 + 60, total: 200 }
  await Bun.sleep(25)
  expect(load.saturated()).toBe(false)
  expect(reads).toBe(3)
})

test('without readable counters the host is never saturated', () => {
  const load = new HostLoad(0, 0, () => null)
  expect(load.saturated()).toBe(false)
})

test.skipIf(!existsSync('/proc/stat'))('on Linux the counters are read from /proc/stat', async () => {
  // Any share is at least 0: once a real interval has passed, a threshold of 0 is met.
  const load = new HostLoad(0, 10)
  await Bun.sleep(30)
  expect(load.saturated()).toBe(true)
})
