import { describe, expect, test } from 'bun:test'
import { generateKeyPairSync, type KeyObject, randomUUID, verify } from 'node:crypto'
import { Signer } from '../../src/signing/signer'

const signer = new Signer()

const keyPair = () => ({ keyId: randomUUID(), ...generateKeyPairSync('ed25519') })
const valid = (text: string, signature: string, publicKey: ReturnType<typeof keyPair>['publicKey']) =>
  verify(null, Buffer.from(text, 'utf8'), publicKey, Buffer.from(signature, 'base64'))

describe('signing worker', () => {
  test('a turn of texts under several keys comes back signed, each with its own key, in order', async () => {
    const pairs = Array.from({ length: 3 }, keyPair)
    const jobs = Array.from({ length: 30 }, (_, i) => ({ pair: pairs[i % 3]!, text: `payload ${i} é€😀` }))
    const signatures = await Promise.all(jobs.map((j) => signer.sign(j.pair.keyId, j.pair.privateKey, j.text)))
    for (const [i, j] of jobs.entries()) {
      expect(signatures[i]).toHaveLength(88)
      expect(valid(j.text, signatures[i]!, j.pair.publicKey)).toBe(true)
    }
  })

  test('past the number of keys the worker keeps, it starts over and still signs with the right key', async () => {
    const first = Array.from({ length: 3000 }, keyPair)
    const second = Array.from({ length: 3000 }, keyPair)
    for (const round of [first, second, first.slice(0, 10)]) {
      const signatures = await Promise.all(round.map((p) => signer.sign(p.keyId, p.privateKey, p.keyId)))
      round.forEach((p, i) => expect(valid(p.keyId, signatures[i]!, p.publicKey)).toBe(true))
    }
  })
})

test('a signer started without a worker signs on the calling thread, with the same signatures', async () => {
  const own = new Signer()
  own.start({ worker: false })
  const pair = keyPair()
  const text = 'payload é€😀'
  const pending = own.sign(pair.keyId, pair.privateKey, text)
  // Ed25519 is deterministic: the worker's signature of the same text is the same bytes.
  expect(Bun.peek(pending)).toBe(await signer.sign(pair.keyId, pair.privateKey, text))
  expect(valid(text, await pending, pair.publicKey)).toBe(true)
})

/** A stand-in for the signing worker that the test answers by hand. */
class FakeWorker {
  onmessage: ((event: { data: unknown }) => void) | null = null
  onerror: ((event: { error: unknown; message: string }) => void) | null = null
  readonly signs: { texts: string[] }[] = []
  readonly #closeListeners: (() => void)[] = []
  terminated = false
  postMessage(msg: { type: string; texts?: string[] }): void {
    if (msg.type === 'sign') this.signs.push({ texts: msg.texts! })
  }
  addEventListener(type: string, listener: () => void): void {
    if (type === 'close') this.#closeListeners.push(listener)
  }
  /** Ends as a worker that exits without an error does: a close event alone. */
  exit(): void {
    for (const listener of this.#closeListeners) listener()
  }
  terminate(): void {
    this.terminated = true
    this.exit()
  }
  unref(): void {}
}

/** A signer whose workers are fakes the test holds, answered by hand. */
function fakeSigner(answerDeadlineMs?: number) {
  const workers: FakeWorker[] = []
  const own = new Signer(() => {
    const fake = new FakeWorker()
    workers.push(fake)
    return fake as unknown as Worker
  }, undefined, answerDeadlineMs)
  return { own, workers }
}

describe('a worker that fails without an error', () => {
  const pair = keyPair()

  test('one that exits: its batches are signed here, once, and the next batch starts another', async () => {
    const { own, workers } = fakeSigner()
    const pending = own.sign(pair.keyId, pair.privateKey, 'held')
    await Bun.sleep(0)
    workers[0]!.exit()
    expect(valid('held', await pending, pair.publicKey)).toBe(true)
    const next = own.sign(pair.keyId, pair.privateKey, 'next')
    await Bun.sleep(0)
    expect(workers).toHaveLength(2)
    workers[1]!.onmessage!({ data: [null] })
    expect(valid('next', await next, pair.publicKey)).toBe(true)
  })

  test('one that stops answering: past the deadline its batches are signed here and it is ended', async () => {
    const { own, workers } = fakeSigner(50)
    const pending = own.sign(pair.keyId, pair.privateKey, 'held')
    await Bun.sleep(0)
    expect(Bun.peek.status(pending)).toBe('pending')
    expect(valid('held', await pending, pair.publicKey)).toBe(true)
    expect(workers[0]!.terminated).toBe(true)
    // One that answers in time is kept, batch after batch.
    for (const text of ['a', 'b']) {
      const next = own.sign(pair.keyId, pair.privateKey, text)
      await Bun.sleep(0)
      workers[1]!.onmessage!({ data: [null] })
      expect(valid(text, await next, pair.publicKey)).toBe(true)
      await Bun.sleep(80)
    }
    expect(workers).toHaveLength(2)
    expect(workers[1]!.terminated).toBe(false)
  })

  test('one that answers out of turn: no batch takes another\'s signatures', async () => {
    const { own, workers } = fakeSigner()
    const pending = own.sign(pair.keyId, pair.privateKey, 'held')
    await Bun.sleep(0)
    workers[0]!.onmessage!({ data: 'garbage' })
    expect(valid('held', await pending, pair.publicKey)).toBe(true)
    expect(workers[0]!.terminated).toBe(true)
  })

  test('the real worker, terminated from outside: signing goes on', async () => {
    let real: Worker | null = null
    const own = new Signer(() => (real = new Worker(new URL('../../src/signing/sign-worker.ts', import.meta.url).href)))
    expect(valid('first', await own.sign(pair.keyId, pair.privateKey, 'first'), pair.publicKey)).toBe(true)
    const first = real!
    first.terminate()
    const signatures = await Promise.all(['x', 'y'].map((text) => own.sign(pair.keyId, pair.privateKey, text)))
    expect(signatures.map((sig, i) => valid(['x', 'y'][i]!, sig, pair.publicKey))).toEqual([true, true])
    // Those went to a new worker, or to the old one and were signed here once its end was reported:
    // either way the next batch has a new worker.
    expect(valid('z', await own.sign(pair.keyId, pair.privateKey, 'z'), pair.publicKey)).toBe(true)
    expect(real).not.toBe(first)
    real!.terminate()
  })
})

test('a worker that failed: its batches are signed here, and an answer it sent late is never taken for the next worker\'s', async () => {
  const workers: FakeWorker[] = []
  const own = new Signer(() => {
    const fake = new FakeWorker()
    workers.push(fake)
    return fake as unknown as Worker
  })
  const pair = keyPair()
  const first = own.sign(pair.keyId, pair.privateKey, 'first')
  await Bun.sleep(0)
  workers[0]!.onerror!({ error: new Error('worker died'), message: 'worker died' })
  expect(valid('first', await first, pair.publicKey)).toBe(true)
  expect(workers[0]!.terminated).toBe(true)

  const second = own.sign(pair.keyId, pair.privateKey, 'second')
  await Bun.sleep(0)
  expect(workers).toHaveLength(2)
  // The dead worker's answer to its own batch arrives after its failure.
  workers[0]!.onmessage!({ data: ['a signature of "first"'] })
  workers[1]!.onmessage!({ data: [null] })
  expect(valid('second', await second, pair.publicKey)).toBe(true)
})

test('a worker that cannot be started leaves its batch signed here, not waiting for ever', async () => {
  let starts = 0
  const own = new Signer(() => {
    starts++
    throw new Error('no more threads')
  })
  const pair = keyPair()
  const signatures = await Promise.all(['a', 'b'].map((text) => own.sign(pair.keyId, pair.privateKey, text)))
  expect(signatures.map((sig, i) => valid(['a', 'b'][i]!, sig, pair.publicKey))).toEqual([true, true])
  // The next batch tries a worker again.
  expect(valid('c', await own.sign(pair.keyId, pair.privateKey, 'c'), pair.publicKey)).toBe(true)
  expect(starts).toBe(2)
})

test('a worker failing again and again is tried after waits that double, up to a minute, and its batches meanwhile are signed here', async () => {
  let starts = 0
  let now = 0
  const own = new Signer(() => {
    starts++
    throw new Error('no more threads')
  }, () => now)
  const pair = keyPair()
  const sign = async (text: string) => expect(valid(text, await own.sign(pair.keyId, pair.privateKey, text), pair.publicKey)).toBe(true)
  await sign('first failure')
  await sign('second failure')
  expect(starts).toBe(2)
  for (const [wait, failures] of [[1000, 3], [2000, 4], [4000, 5]] as const) {
    now += wait - 1
    await sign('still waiting')
    expect(starts).toBe(failures - 1)
    now += 1
    await sign('tried again')
    expect(starts).toBe(failures)
  }
  for (let i = 0; i < 10; i++) {
    now += 60_000
    await sign('a minute apart at most')
  }
  expect(starts).toBe(15)
})

test('a worker that answers ends the waits: its own failure later is retried with the next batch', async () => {
  const workers: FakeWorker[] = []
  let failStart = true
  const own = new Signer(() => {
    if (failStart) {
      failStart = false
      throw new Error('no more threads')
    }
    const fake = new FakeWorker()
    workers.push(fake)
    return fake as unknown as Worker
  }, () => 5000)
  const pair = keyPair()
  await own.sign(pair.keyId, pair.privateKey, 'signed here')
  const answered = own.sign(pair.keyId, pair.privateKey, 'by the worker')
  await Bun.sleep(0)
  workers[0]!.onmessage!({ data: [null] })
  await answered
  workers[0]!.onerror!({ error: new Error('worker died'), message: 'worker died' })
  // The clock stands still: only the answer's reset lets a worker start at once after this second failure.
  const next = own.sign(pair.keyId, pair.privateKey, 'next')
  await Bun.sleep(0)
  expect(workers).toHaveLength(2)
  workers[1]!.onmessage!({ data: [null] })
  expect(valid('next', await next, pair.publicKey)).toBe(true)
})

describe('a key that cannot sign (not Ed25519) fails its own signature alone', () => {
  const good = keyPair()
  const bad = { keyId: randomUUID(), ...generateKeyPairSync('x25519') }
  const outcomes = (signer: Signer, keys: { keyId: string; privateKey: KeyObject }[]) =>
    Promise.allSettled(keys.map((k) => signer.sign(k.keyId, k.privateKey, k.keyId))).then((all) => all.map((r) => r.status))

  test('on the worker', async () => {
    const own = new Signer()
    own.start({ worker: true })
    expect(await outcomes(own, [good, bad, good])).toEqual(['fulfilled', 'rejected', 'fulfilled'])
    // The worker lives on: the next batch is its answer.
    expect(valid('next', await own.sign(good.keyId, good.privateKey, 'next'), good.publicKey)).toBe(true)
  })

  test('on the calling thread', async () => {
    const own = new Signer()
    own.start({ worker: false })
    expect(await outcomes(own, [good, bad, good])).toEqual(['fulfilled', 'rejected', 'fulfilled'])
  })

  test("in a failed worker's batches, signed here", async () => {
    const { own, workers } = fakeSigner()
    const settled = outcomes(own, [good, bad, good])
    await Bun.sleep(0)
    workers[0]!.exit()
    expect(await settled).toEqual(['fulfilled', 'rejected', 'fulfilled'])
  })
})
