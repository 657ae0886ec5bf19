import { afterAll, expect, test } from 'bun:test'
import { startDispatcher } from '../../src/delivery/dispatcher'
import { DeliveryPool } from '../../src/delivery/pool'
import { makeTestApp, MODE } from '../support/helpers'
import { startReceiver, testCertificate, until } from '../support/webhooks-receiver'

/**
 * Every delivery worker started in this process, run from a copy that can be told to hold its event
 * loop. A pool starts its worker within its first send, and other pools of the process (the contexts of
 * earlier test files) may start theirs while a test waits: a test faults the worker at the index it
 * noted just before that send, never the newest.
 */
const started: Worker[] = []
const RealWorker = globalThis.Worker
globalThis.Worker = class extends RealWorker {
  constructor(url: string | URL, options?: WorkerOptions) {
    const holding = String(url).endsWith('/delivery/worker/thread.ts') ? new URL('../fixtures/holding-delivery-worker.ts', import.meta.url).href : url
    super(holding, options)
    started.push(this)
  }
} as typeof Worker
afterAll(() => {
  globalThis.Worker = RealWorker
})

const job = (url: string) => ({ url, headers: { 'content-type': 'application/json' }, body: '{}' })

test.each([
  ['exits without an error', (worker: Worker) => worker.terminate()],
  ['holds its event loop', (worker: Worker) => worker.postMessage('hold')],
])('a worker that %s: its deliveries end at once or within the stuck bound, and the next goes on a new one', async (_name, fault) => {
  // A worker started on a busy host can take most of a second to answer its first ping: 600 ms lost
  // each replacement in turn. The slow answer comes well after the bound.
  const pool = new DeliveryPool({ allowPrivate: true, extraCaFile: testCertificate().certFile, size: 1, timeoutMs: 15_000, stuckAfterMs: 2_000 })
  await using slow = startReceiver(() => ({ delayMs: 10_000 }))
  await using fast = startReceiver()
  try {
    const mine = started.length
    expect(await pool.send(job(fast.url('/before')))).toEqual({ status: 200 })
    const held = pool.send(job(slow.url('/held')))
    // On its way from the worker that took it (a fixed wait was too short for a worker to start on a busy host).
    await until(() => slow.at('/held').length === 1, 'the held request at its receiver')
    const faulted = performance.now()
    fault(started[mine]!)
    expect(await held).toEqual({ status: 0, reason: 'worker' })
    expect(performance.now() - faulted).toBeLessThan(5_000)
    expect(await pool.send(job(fast.url('/after')))).toEqual({ status: 200 })
    expect(fast.at('/after')).toHaveLength(1)
  } finally {
    await pool.close()
  }
}, 20_000)

test('a worker lost with jobs queued behind its open requests: those it never started go on another worker, once', async () => {
  // One request at a time: the held job is on its way, the queued ones wait in the worker.
  const pool = new DeliveryPool({ allowPrivate: true, extraCaFile: testCertificate().certFile, size: 1, timeoutMs: 5_000, concurrency: 1 })
  await using slow = startReceiver(() => ({ delayMs: 3_000 }))
  await using fast = startReceiver()
  try {
    const mine = started.length
    const held = pool.send(job(slow.url('/held')))
    const queued = [pool.send(job(fast.url('/queued/1'))), pool.send(job(fast.url('/queued/2')))]
    await until(() => slow.at('/held').length === 1, 'the held request at its receiver')
    started[mine]!.terminate()
    // Lost with its worker; or, where Bun let the terminated worker finish the request it had open (seen
    // on a loaded host, 3 s later), answered as the receiver did.
    expect([{ status: 0, reason: 'worker' }, { status: 200 }]).toContainEqual(await held)
    expect(await Promise.all(queued)).toEqual([{ status: 200 }, { status: 200 }])
    expect(fast.at('/queued/1')).toHaveLength(1)
    expect(fast.at('/queued/2')).toHaveLength(1)
    // A job that fails every worker it reaches is given up with the second: the one it went to, and
    // the replacement that took it again.
    const before = started.length
    expect(await pool.send(job(fast.url('/poison')))).toEqual({ status: 0, reason: 'worker' })
    expect(started.length - before).toBe(1)
    expect(await pool.send(job(fast.url('/after')))).toEqual({ status: 200 })
  } finally {
    await pool.close()
  }
}, 20_000)

test.each([
  ['holds its event loop before the withdrawal', (w: Worker) => w.postMessage('hold'), false],
  ['exits right after the withdrawal', (w: Worker) => w.terminate(), true],
])('a job withdrawn while queued in a worker that %s is not sent where it was headed: it comes back cancelled', async (_name, fault, after) => {
  const pool = new DeliveryPool({ allowPrivate: true, extraCaFile: testCertificate().certFile, size: 1, timeoutMs: 5_000, concurrency: 1, stuckAfterMs: 600 })
  await using slow = startReceiver(() => ({ delayMs: 3_000 }))
  await using receiver = startReceiver()
  try {
    const mine = started.length
    const held = pool.send({ ...job(slow.url('/held')), webhookId: 'wh-a' })
    const queued = pool.send({ ...job(receiver.url('/old')), webhookId: 'wh-b' })
    await Bun.sleep(200)
    if (!after) fault(started[mine]!)
    pool.cancelQueued(new Map([['wh-b', receiver.url('/new')]]))
    if (after) fault(started[mine]!)
    expect(await queued).toEqual({ status: 0, reason: 'cancelled' })
    expect(receiver.at('/old')).toHaveLength(0)
    await held
  } finally {
    await pool.close()
  }
}, 20_000)

test('a process whose last work waits on a worker that stopped answering stays up until the stuck bound answers it', async () => {
  await using hanging = startReceiver(() => 'hang')
  const fixture = new URL('../fixtures/pool-stuck-worker.ts', import.meta.url).pathname
  const child = Bun.spawn([process.execPath, fixture, hanging.url('/held'), testCertificate().certFile], { stdout: 'pipe', stderr: 'pipe' })
  const [out, code] = await Promise.all([new Response(child.stdout).text(), child.exited])
  expect(code).toBe(0)
  expect(JSON.parse(out.trim().split('\n').at(-1) ?? 'null')).toEqual({ status: 0, reason: 'worker' })
}, 20_000)

test.skipIf(MODE !== 'postgres')('a dispatching worker that holds its event loop: the dispatcher is started again, and a stop ends in time', async () => {
  const t = await makeTestApp()
  t.ctx.webhookPool = new DeliveryPool({ allowPrivate: true, extraCaFile: testCertificate().certFile, stuckAfterMs: 600, dispatchStopMs: 2_000 })
  const before = started.length
  const dispatcher = startDispatcher(t.ctx, { pollMs: 50 })
  try {
    await Bun.sleep(300)
    // The pool's first worker runs the dispatcher.
    started[before]!.postMessage('hold')
    for (const end = performance.now() + 5_000; started.length < before + 3 && performance.now() < end; ) await Bun.sleep(50)
    expect(started.length).toBe(before + 3)
    const stopping = performance.now()
    await dispatcher.stop()
    expect(performance.now() - stopping).toBeLessThan(3_000)
  } finally {
    await t.ctx.webhookPool.close()
  }
}, 20_000)
