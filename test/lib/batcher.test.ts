import { describe, expect, test } from 'bun:test'
import { TurnBatcher } from '../../src/lib/batcher'

const turn = () => new Promise<void>((resolve) => setImmediate(resolve))
/** Past a settled call's follow-up: the settle reaches the batcher in a microtask, its next call a turn later. */
const turns = async (n: number) => {
  for (let i = 0; i < n; i++) await turn()
}

/** A send that records each batch and keeps its call open until the test settles it. */
function recordingSend() {
  const calls: { items: number[]; settle(fail?: boolean): void }[] = []
  const send = (items: number[]) =>
    new Promise<void>((resolve, reject) => {
      calls.push({ items, settle: (fail = false) => (fail ? reject(new Error('call failed')) : resolve()) })
    })
  return { calls, send }
}

/** A oneInFlight batcher over recordingSend, with its first call (of item 1) made and settled. */
async function afterOneCall() {
  const { calls, send } = recordingSend()
  const batcher = new TurnBatcher<number>(send, { oneInFlight: true })
  batcher.add(1)
  await Promise.resolve()
  calls[0]!.settle()
  return { calls, batcher }
}

describe('TurnBatcher', () => {
  test('what one turn adds goes in one call, before the next turn', async () => {
    const batches: number[][] = []
    const batcher = new TurnBatcher<number>((items) => void batches.push(items))
    for (let i = 0; i < 5; i++) batcher.add(i)
    expect(batches).toEqual([])
    await Promise.resolve()
    expect(batches).toEqual([[0, 1, 2, 3, 4]])
    batcher.add(5)
    await turn()
    expect(batches).toEqual([[0, 1, 2, 3, 4], [5]])
  })

  test('oneInFlight: what waits for the call in flight goes together once it settles, with what the next turn adds', async () => {
    const { calls, send } = recordingSend()
    const batcher = new TurnBatcher<number>(send, { oneInFlight: true })
    batcher.add(1)
    await turn()
    expect(calls.map((c) => c.items)).toEqual([[1]])
    batcher.add(2)
    batcher.add(3)
    await turn()
    expect(calls).toHaveLength(1)
    calls[0]!.settle()
    await Promise.resolve()
    await Promise.resolve()
    // Settled, but the next call waits a turn: items read meanwhile join it, the first of them too.
    expect(calls).toHaveLength(1)
    batcher.add(4)
    await turns(2)
    expect(calls.map((c) => c.items)).toEqual([[1], [2, 3, 4]])
  })

  test('oneInFlight: with nothing waiting as a call settles, what the next turn reads still goes as one call', async () => {
    const { calls, batcher } = await afterOneCall()
    await Promise.resolve()
    batcher.add(2)
    await Promise.resolve()
    batcher.add(3)
    await turns(2)
    expect(calls.map((c) => c.items)).toEqual([[1], [2, 3]])
  })

  test('oneInFlight: an item that finds nothing in flight or waiting goes at once', async () => {
    const { calls, batcher } = await afterOneCall()
    await turns(2)
    batcher.add(2)
    await Promise.resolve()
    expect(calls.map((c) => c.items)).toEqual([[1], [2]])
  })

  test('oneInFlight: a call that fails, or a send that throws, does not hold up the next batch', async () => {
    const { calls, send } = recordingSend()
    let throwNext = false
    const batcher = new TurnBatcher<number>(
      (items) => {
        if (throwNext) {
          throwNext = false
          throw new Error('send threw')
        }
        return send(items)
      },
      { oneInFlight: true },
    )
    batcher.add(1)
    await turn()
    batcher.add(2)
    calls[0]!.settle(true)
    await turns(2)
    expect(calls.map((c) => c.items)).toEqual([[1], [2]])
    throwNext = true
    batcher.add(3)
    calls[1]!.settle()
    await turns(2)
    // 3 went to the send that threw; 4 still goes.
    batcher.add(4)
    await turn()
    expect(calls.map((c) => c.items)).toEqual([[1], [2], [4]])
  })
})
