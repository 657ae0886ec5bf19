import { expect, test } from 'bun:test'
import { processFamilies, startEventLoopMonitor } from '../../src/lib/process-metrics'

const delayOf = () => processFamilies().find((f) => f.name === 'process_event_loop_delay_seconds')
const maxOf = () => delayOf()?.samples.find(([, labels]) => labels === 'stat="max"')?.[2]

// A short window (the first call's holds for the test process), so windows close within a test.
const WINDOW_MS = 50

test('a read leaves the window alone: back-to-back scrapes report the same event-loop delay', async () => {
  startEventLoopMonitor(WINDOW_MS)
  await Bun.sleep(WINDOW_MS * 2.5)
  const first = delayOf()
  expect(first?.samples.map(([, labels]) => labels)).toEqual(['stat="mean"', 'stat="p99"', 'stat="max"'])
  expect(delayOf()).toEqual(first)
})

test('the figures are those of the last complete window: a stall shows once its window closes, then goes', async () => {
  startEventLoopMonitor(WINDOW_MS)
  await Bun.sleep(WINDOW_MS * 2.5)
  const end = performance.now() + 80
  while (performance.now() < end) {
    // Holds the event loop, as a slow synchronous handler would.
  }
  // The stall lands in the window open during it or the next one.
  const maxima: number[] = []
  for (let i = 0; i < 30; i++) {
    await Bun.sleep(10)
    maxima.push(maxOf() ?? Number.NaN)
  }
  expect(Math.max(...maxima)).toBeGreaterThanOrEqual(0.05)
  expect(maxima.at(-1)).toBeLessThan(0.05)
})
