import { describe, expect, test } from 'bun:test'
import { setLogLevel } from '../../../src/lib/log'
import { Schedule } from '../../../src/delivery/dispatch/schedule'
import { until } from '../../support/webhooks-receiver'

setLogLevel('error')
// Passes are spaced from the last one, taken as time 0 before the first: let the process clock pass
// the gaps used here, so every start's pass runs at once.
await Bun.sleep(Math.max(0, 1_000 - performance.now()))

/** Work whose passes the test ends by hand, counting what the schedule asked for. */
function fakeWork() {
  const calls = { passes: 0, committed: 0, polled: 0 }
  /** When each pass began (performance.now()). */
  const began: number[] = []
  let end: ((more: boolean) => void) | null = null
  let fail: ((err: Error) => void) | null = null
  let room = true
  return {
    calls,
    began,
    work: {
      committed: () => void calls.committed++,
      polled: () => void calls.polled++,
      pass: () => {
        calls.passes++
        began.push(performance.now())
        return new Promise<boolean>((resolve, reject) => {
          end = resolve
          fail = reject
        })
      },
      ready: () => room,
    },
    /** Ends the pass under way, saying whether more is waiting. */
    async endPass(more = false) {
      end?.(more)
      end = null
      await Bun.sleep(0)
    },
    async failPass() {
      fail?.(new Error('database gone'))
      await Bun.sleep(0)
    },
    setRoom(value: boolean) {
      room = value
    },
  }
}

function commitSignal() {
  let listener: (() => void) | null = null
  return {
    onCommit(l: () => void) {
      listener = l
      return () => {
        listener = null
      }
    },
    commit: () => listener?.(),
    get subscribed() {
      return listener !== null
    },
  }
}

describe('schedule', () => {
  test('a pass runs at start; wake-ups during a pass cost one more, spaced by minGapMs', async () => {
    const f = fakeWork()
    const bus = commitSignal()
    const schedule = new Schedule({ pollMs: 60_000, minGapMs: 300, load: null, onCommit: bus.onCommit }, f.work)
    schedule.start()
    expect(f.calls.passes).toBe(1)
    bus.commit()
    bus.commit()
    bus.commit()
    expect(f.calls).toEqual({ passes: 1, committed: 3, polled: 0 })
    await f.endPass()
    await until(() => f.calls.passes === 2, 'the pass for the wake-ups')
    // The gap counts from when the first pass was started, which is before its work began by however long
    // the first call took to get there (12 ms once in CI): spaced, not at once, is what is checked.
    expect(f.began[1]! - f.began[0]!).toBeGreaterThanOrEqual(250)
    await f.endPass()
    await Bun.sleep(400)
    expect(f.calls.passes).toBe(2)
    await schedule.stop()
  })

  test('while work is waiting and there is room, the next pass follows at once; without room it waits', async () => {
    const f = fakeWork()
    const bus = commitSignal()
    const schedule = new Schedule({ pollMs: 60_000, minGapMs: 500, load: null, onCommit: bus.onCommit }, f.work)
    schedule.start()
    await f.endPass(true)
    await until(() => f.calls.passes === 2, 'the pass for the backlog')
    expect(f.began[1]! - f.began[0]!).toBeLessThan(500)
    f.setRoom(false)
    await f.endPass(true)
    await Bun.sleep(40)
    expect(f.calls.passes).toBe(2)
    await schedule.stop()
  })

  test('the poll runs a pass and asks for the claim too', async () => {
    const f = fakeWork()
    const bus = commitSignal()
    const schedule = new Schedule({ pollMs: 40, minGapMs: 0, load: null, onCommit: bus.onCommit }, f.work)
    schedule.start()
    await f.endPass()
    await until(() => f.calls.passes === 2, "the poll's pass")
    expect(f.calls.polled).toBeGreaterThanOrEqual(1)
    const stopping = schedule.stop()
    await f.endPass()
    await stopping
  })

  test('while API requests are short of CPU, commits run no pass and the poll still does', async () => {
    const f = fakeWork()
    const bus = commitSignal()
    const schedule = new Schedule({ pollMs: 400, minGapMs: 0, load: { saturated: () => true }, onCommit: bus.onCommit }, f.work)
    schedule.start()
    // The start's pass counts as the poll's.
    expect(f.calls.passes).toBe(1)
    await f.endPass()
    bus.commit()
    await Bun.sleep(50)
    expect(f.calls).toMatchObject({ passes: 1, committed: 1 })
    await until(() => f.calls.passes === 2, "the poll's pass")
    expect(f.calls.polled).toBe(1)
    const stopping = schedule.stop()
    await f.endPass()
    await stopping
  })

  test('a failed pass leaves the rest to the poll', async () => {
    const f = fakeWork()
    const bus = commitSignal()
    const schedule = new Schedule({ pollMs: 60_000, minGapMs: 0, load: null, onCommit: bus.onCommit }, f.work)
    schedule.start()
    await f.failPass()
    await Bun.sleep(30)
    expect(f.calls.passes).toBe(1)
    // It keeps listening: the next commit runs a pass.
    bus.commit()
    expect(f.calls.passes).toBe(2)
    await f.endPass()
    await schedule.stop()
  })

  test('stop ends the wake-ups at once and waits for the pass under way', async () => {
    const f = fakeWork()
    const bus = commitSignal()
    const schedule = new Schedule({ pollMs: 20, minGapMs: 0, load: null, onCommit: bus.onCommit }, f.work)
    schedule.start()
    let stopped = false
    const stopping = schedule.stop().then(() => {
      stopped = true
    })
    expect(schedule.running).toBe(false)
    expect(bus.subscribed).toBe(false)
    await Bun.sleep(10)
    expect(stopped).toBe(false)
    await f.endPass()
    await stopping
    expect(stopped).toBe(true)
    await Bun.sleep(60)
    expect(f.calls.passes).toBe(1)
    expect(f.calls.polled).toBe(0)
  })
})
