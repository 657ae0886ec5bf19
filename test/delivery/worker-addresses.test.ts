/**
 * A worker's sending side (delivery/worker/deliveries.ts): a receiver whose name resolves to several
 * vetted addresses, where a delivery refused or unreachable at one (an AAAA record on a host without
 * IPv6 routes) goes to the next, and nothing is sent twice; a test ping beside a receiver's backlog.
 */
import { afterAll, expect, test } from 'bun:test'
import { Deliveries } from '../../src/delivery/worker/deliveries'
import { startReceiver, testCertificate } from '../support/webhooks-receiver'

const receiver = startReceiver((path) => (path === '/hang' ? 'hang' : 200))
afterAll(() => receiver.stop())
const port = new URL(receiver.base).port

/** A worker's sending side that resolves every host to `addresses`, with private targets refused as in production. */
function deliveriesTo(addresses: string[], limits: { perHost?: number; concurrency?: number; timeoutMs?: number } = {}) {
  const deliveries = new Deliveries(async () => addresses)
  deliveries.configure({
    type: 'init',
    allowPrivate: false,
    ca: [testCertificate().cert],
    timeoutMs: limits.timeoutMs ?? 5_000,
    concurrency: limits.concurrency ?? 4,
    perHost: limits.perHost ?? 4,
    lowPriority: false,
  })
  return deliveries
}

const job = (path: string) => ({ url: `https://localhost:${port}${path}`, headers: { 'content-type': 'application/json' }, body: '{"event":"test.ping"}' })

test('an address that refuses the connection is passed over for the next', async () => {
  // ::1 has no receiver on this port (it listens on 127.0.0.1 alone): refused, or unreachable without IPv6.
  expect(await deliveriesTo(['::1', '127.0.0.1']).send(job('/next'))).toEqual({ status: 200 })
  expect(receiver.at('/next')).toHaveLength(1)
})

test('every address refusing is one failed delivery', async () => {
  expect(await deliveriesTo(['::1']).send(job('/none'))).toEqual({ status: 0, reason: 'connection' })
  expect(receiver.at('/none')).toHaveLength(0)
})

test("a test ping goes at once, past its host's limit and ahead of the deliveries queued for it", async () => {
  const deliveries = deliveriesTo(['127.0.0.1'], { perHost: 1 })
  const outbox = (path: string) => ({ ...job(path), webhookId: 'wh_backlog' })
  // The host's one request is held by a receiver that hangs, and another delivery waits for it.
  const held = deliveries.send(outbox('/hang'))
  const queued = deliveries.send(outbox('/after'))
  const started = performance.now()
  expect(await deliveries.send(job('/ping'))).toEqual({ status: 200 })
  expect(performance.now() - started).toBeLessThan(2_000)
  expect(receiver.at('/after')).toHaveLength(0)
  expect(await held).toEqual({ status: 0, reason: 'timeout' })
  expect(await queued).toEqual({ status: 200 })
}, 15_000)

test('test pings queued while every request is taken go in the order they came, before the deliveries', async () => {
  const deliveries = deliveriesTo(['127.0.0.1'], { concurrency: 1, timeoutMs: 500 })
  const outbox = (path: string) => ({ ...job(path), webhookId: 'wh_backlog' })
  const held = deliveries.send(outbox('/hang'))
  const sent = [deliveries.send(outbox('/order-delivery')), deliveries.send(job('/order-ping-1')), deliveries.send(job('/order-ping-2'))]
  await Promise.all([held, ...sent])
  const order = receiver.received.map((r) => r.path).filter((path) => path.startsWith('/order-'))
  expect(order).toEqual(['/order-ping-1', '/order-ping-2', '/order-delivery'])
})

