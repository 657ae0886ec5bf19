import { expect, test } from 'bun:test'
import { existsSync } from 'node:fs'
import { type CpuTimes, HostLoad } from '../../../src/delivery/dispatch/host-load'

test('API requests count as short of CPU when the host and the API thread are both busy over the last interval', async () => {
  let now: CpuTimes = { busy: 0, total: 0, api: 0 }
  let reads = 0
  // Two CPUs: 100 ticks of all CPUs are 50 ticks of one.
  const load = new HostLoad(0.7, 0.25, 20, () => {
    reads++
    return now
  }, 2)
  expect(load.saturated()).toBe(false)
  now = { busy: 80, total: 100, api: 20 }
  // Within the interval the last answer stands, without reading.
  expect(load.saturated()).toBe(false)
  expect(reads).toBe(1)
  await Bun.sleep(25)
  expect(load.saturated()).toBe(true)
  // The host stays busy but not with the API thread (a backlog's database work): not short of CPU.
  now = { busy: 160, total: 200, api: 25 }
  await Bun.sleep(25)
  expect(load.saturated()).toBe(false)
  // A busy API thread on an idle host is not short of CPU either.
  now = { busy: 200, total: 300, api: 60 }
  await Bun.sleep(25)
  expect(load.saturated()).toBe(false)
  expect(reads).toBe(4)
})

test('without readable counters the host is never saturated', () => {
  const load = new HostLoad(0, 0, 0, () => null)
  expect(load.saturated()).toBe(false)
})

test.skipIf(!existsSync('/proc/stat'))('on Linux the counters are read from /proc', async () => {
  // Any share is at least 0: once a real interval has passed, thresholds of 0 are met.
  const load = new HostLoad(0, 0, 10)
  await Bun.sleep(30)
  expect(load.saturated()).toBe(true)
})
