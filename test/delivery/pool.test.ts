import { expect, test } from 'bun:test'
import { DeliveryPool } from '../../src/delivery/pool'
import { startReceiver, testCertificate } from '../support/webhooks-receiver'

function jobTo(url: string) {
  return { url, headers: { 'content-type': 'application/json' }, body: '{"ping":true}' }
}

test('jobs cancelled in the turn they were sent are answered cancelled and never leave; later ones go out', async () => {
  await using rx = startReceiver()
  const pool = new DeliveryPool({ allowPrivate: true, extraCaFile: testCertificate().certFile, size: 1 })
  try {
    pool.start()
    const first = pool.send(jobTo(rx.url('/cancelled')))
    const second = pool.send(jobTo(rx.url('/cancelled')))
    pool.cancelQueued()
    expect(await Promise.all([first, second])).toEqual([
      { status: 0, reason: 'cancelled' },
      { status: 0, reason: 'cancelled' },
    ])
    expect(pool.inFlight).toBe(0)

    // Jobs of one turn travel together and each gets its own answer.
    const answers = await Promise.all([pool.send(jobTo(rx.url('/sent'))), pool.send(jobTo(rx.url('/sent')))])
    expect(answers).toEqual([{ status: 200 }, { status: 200 }])
    expect(rx.at('/sent')).toHaveLength(2)
    expect(rx.at('/cancelled')).toHaveLength(0)
  } finally {
    await pool.close()
  }
})

test('a job already on its way runs to its end when the queue is cancelled', async () => {
  await using rx = startReceiver()
  const pool = new DeliveryPool({ allowPrivate: true, extraCaFile: testCertificate().certFile, size: 1 })
  try {
    const sending = pool.send(jobTo(rx.url('/on-its-way')))
    // Posted to the worker at the end of this turn.
    await Bun.sleep(0)
    pool.cancelQueued()
    expect(await sending).toEqual({ status: 200 })
    expect(rx.at('/on-its-way')).toHaveLength(1)
  } finally {
    await pool.close()
  }
})

test('a stored URL that the checks of today refuse is not sent to: blocked, whatever the private-target setting', async () => {
  const seen: string[] = []
  using plain = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: (req) => (seen.push(req.url), new Response('ok')) })
  const pool = new DeliveryPool({ allowPrivate: true, extraCaFile: testCertificate().certFile, size: 1 })
  try {
    // Plain http would carry the signed payload in the clear; file:// would answer 200 from a local read.
    for (const url of [`http://127.0.0.1:${plain.port}/hook`, 'file:///etc/hostname', `https://user:pw@127.0.0.1:${plain.port}/hook`, 'not a url']) {
      expect(await pool.send(jobTo(url)), url).toEqual({ status: 0, reason: 'blocked' })
    }
    expect(seen).toEqual([])
  } finally {
    await pool.close()
  }
})

test("a webhook's queued jobs for a URL it no longer has are cancelled; its jobs for the new URL and other webhooks' keep their place", async () => {
  await using rx = startReceiver((path) => (path === '/held' ? 'hang' : 200))
  // One request at a time to the receiver's host: the first hangs, the rest queue behind it.
  const pool = new DeliveryPool({ allowPrivate: true, extraCaFile: testCertificate().certFile, size: 1, perHost: 1, timeoutMs: 1_500 })
  const of = (webhookId: string, path: string) => ({ ...jobTo(rx.url(path)), webhookId })
  try {
    const held = pool.send(of('wh_other', '/held'))
    const old = pool.send(of('wh_moved', '/old'))
    const moved = pool.send(of('wh_moved', '/new'))
    const other = pool.send(of('wh_other', '/old'))
    await Bun.sleep(200)
    pool.cancelQueued(new Map([['wh_moved', rx.url('/new')]]))
    expect(await old).toEqual({ status: 0, reason: 'cancelled' })
    expect(Bun.peek.status(moved)).toBe('pending')
    // In queue order once the held request times out.
    expect(await Promise.all([held, moved, other])).toEqual([{ status: 0, reason: 'timeout' }, { status: 200 }, { status: 200 }])
    expect(rx.received.map((r) => r.path)).toEqual(['/held', '/new', '/old'])
  } finally {
    await pool.close()
  }
})
