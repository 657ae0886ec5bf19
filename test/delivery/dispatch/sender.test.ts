import { describe, expect, test } from 'bun:test'
import type { Claimed } from '../../../src/delivery/dispatch/claim'
import { Sender } from '../../../src/delivery/dispatch/sender'
import type { Attempt } from '../../../src/delivery/attempts'
import type { DeliveryJob, DeliveryResult } from '../../../src/delivery/protocol'
import { hmacHex } from '../../../src/lib/crypto'
import { setLogLevel } from '../../../src/lib/log'

setLogLevel('error')

const AT = Date.UTC(2026, 2, 1)

function claimed(eventId: number, over: Partial<Claimed> = {}): Claimed {
  return {
    eventId,
    webhookId: 'wh_1',
    accountId: 'account-1',
    event: 'license.created',
    data: `{"licenseKey":"KEY-${eventId}"}`,
    occurredAt: new Date(AT),
    url: 'https://receiver.example/hook',
    secretEnc: 'sealed-1',
    enabled: true,
    ...over,
  }
}

/** A sender over a pool the test answers by hand, and a ledger that remembers. */
function harness(maxInFlight = 8, openSecret: (sealed: string) => Promise<string> = async (s) => `secret-of-${s}`) {
  /** The sender's real-time clock, moved by the test. */
  const elapsed = { ms: 0 }
  const sent: { job: DeliveryJob; answer: (r: DeliveryResult) => void }[] = []
  /** What the sender withdrew, one list of webhooks with the URL each now goes to per call. */
  const cancelled: [string, string | null][][] = []
  const opened: string[] = []
  const recorded: Attempt[] = []
  const handedBack: number[] = []
  const owned = new Set<number>()
  let freed = 0
  const sender = new Sender(
    {
      send: (job) => new Promise((answer) => sent.push({ job, answer })),
      cancelQueued: (withdrawn) => void cancelled.push([...(withdrawn ?? [])].sort()),
      openSecret: (sealed) => {
        opened.push(sealed)
        return openSecret(sealed)
      },
      clock: () => AT + 5_000,
    },
    {
      take: (d) => !owned.has(d.eventId) && Boolean(owned.add(d.eventId)),
      record: (a) => {
        recorded.push(a)
        if (a.eventId !== undefined) owned.delete(a.eventId)
      },
      handBack: (d) => {
        handedBack.push(d.eventId)
        owned.delete(d.eventId)
      },
    },
    { maxInFlight, perAccountShare: 1 },
    () => void freed++,
    () => elapsed.ms,
  )
  return { sender, sent, opened, recorded, handedBack, cancelled, freed: () => freed, elapsed }
}

const settle = () => Bun.sleep(0)

describe('sender', () => {
  test('sends the spec body signed with the webhook secret, opening each secret once', async () => {
    const h = harness()
    h.sender.send(claimed(1))
    await settle()
    expect(h.sent).toHaveLength(1)
    const { job } = h.sent[0]!
    expect(job.url).toBe('https://receiver.example/hook')
    expect(JSON.parse(job.body)).toEqual({ event: 'license.created', timestamp: new Date(AT).toISOString(), data: { licenseKey: 'KEY-1' } })
    expect(job.headers['x-service-signature']).toBe(`sha256=${hmacHex('secret-of-sealed-1', job.body)}`)
    h.sent[0]!.answer({ status: 204 })
    await settle()

    h.sender.send(claimed(2))
    await settle()
    expect(h.sent).toHaveLength(2)
    expect(h.opened).toEqual(['sealed-1'])
    h.sent[1]!.answer({ status: 500 })
    await h.sender.idle()
    expect(h.recorded).toEqual([
      { eventId: 1, webhookId: 'wh_1', at: new Date(AT + 5_000), status: 204 },
      { eventId: 2, webhookId: 'wh_1', at: new Date(AT + 5_000), status: 500 },
    ])
    expect(h.freed()).toBe(2)
  })

  test('a delivery already on the way is not sent again', async () => {
    const h = harness()
    h.sender.send(claimed(1))
    h.sender.send(claimed(1))
    await settle()
    expect(h.sent).toHaveLength(1)
    expect(h.sender.room().free).toBe(7)
  })

  test('a delivery whose webhook was disabled is recorded as skipped without sending', async () => {
    const h = harness()
    h.sender.send(claimed(1, { enabled: false }))
    await settle()
    expect(h.sent).toHaveLength(0)
    expect(h.recorded).toEqual([{ eventId: 1, webhookId: 'wh_1', at: new Date(AT + 5_000), status: null }])
    expect(h.sender.room().free).toBe(8)
  })

  test('a delivery cancelled in the queue at stop is handed back, not recorded', async () => {
    const h = harness()
    h.sender.send(claimed(1))
    await settle()
    h.sender.stopping()
    h.sent[0]!.answer({ status: 0, reason: 'cancelled' })
    await h.sender.idle()
    expect(h.handedBack).toEqual([1])
    expect(h.recorded).toEqual([])
  })

  test('a queued delivery whose webhook moved goes to its new URL; one disabled or deleted since the claim is closed unsent', async () => {
    const h = harness()
    const hooks = ['wh_moved', 'wh_disabled', 'wh_deleted', 'wh_same']
    hooks.forEach((webhookId, i) => h.sender.send(claimed(i + 1, { webhookId })))
    await settle()
    expect(h.sent.map((s) => s.job.webhookId)).toEqual(hooks)
    // Only deliveries out for over a second may be waiting behind a host.
    h.elapsed.ms = 900
    expect(h.sender.waiting()).toEqual([])
    h.elapsed.ms = 1_100
    expect(h.sender.waiting().sort()).toEqual([...hooks].sort())
    const now = new Map([
      ['wh_moved', { url: 'https://elsewhere.example/hook', enabled: true }],
      ['wh_disabled', { url: 'https://receiver.example/hook', enabled: false }],
      ['wh_same', { url: 'https://receiver.example/hook', enabled: true }],
    ])
    h.sender.withdraw(hooks, now)
    expect(h.cancelled).toEqual([
      [
        ['wh_deleted', null],
        ['wh_disabled', null],
        ['wh_moved', 'https://elsewhere.example/hook'],
      ],
    ])
    // The pool answers the three still queued.
    for (const s of h.sent.slice(0, 3)) s.answer({ status: 0, reason: 'cancelled' })
    await settle()
    await settle()
    const again = h.sent.slice(4)
    expect(again.map((s) => [s.job.webhookId, s.job.url])).toEqual([['wh_moved', 'https://elsewhere.example/hook']])
    expect(again[0]!.job.headers['x-service-signature']).toBe(`sha256=${hmacHex('secret-of-sealed-1', again[0]!.job.body)}`)
    expect(h.recorded.map((a) => [a.eventId, a.status])).toEqual([[2, null], [3, null]])
    expect(h.handedBack).toEqual([])
    expect(h.sender.room().free).toBe(8 - 2)
    // What it withdrew is not withdrawn again: the moved delivery now goes where its webhook says.
    h.elapsed.ms = 2_500
    h.sender.withdraw(h.sender.waiting(), now)
    expect(h.cancelled).toHaveLength(1)
  })

  test('a secret that cannot be opened records status 0 without sending', async () => {
    const h = harness(8, async () => {
      throw new Error('sealed under another key')
    })
    h.sender.send(claimed(1))
    await h.sender.idle()
    expect(h.sent).toHaveLength(0)
    expect(h.recorded).toEqual([{ eventId: 1, webhookId: 'wh_1', at: new Date(AT + 5_000), status: 0 }])
  })

  test('while deliveries are out, a claim is worth it only once a quarter of the slots is free', async () => {
    const h = harness(8)
    expect(h.sender.worthClaiming()).toBe(true)
    for (let i = 1; i <= 7; i++) h.sender.send(claimed(i))
    await settle()
    // 1 free of 8, below the chunk of 2.
    expect(h.sender.room().free).toBe(1)
    expect(h.sender.worthClaiming()).toBe(false)
    h.sent[0]!.answer({ status: 200 })
    await settle()
    expect(h.sender.room().free).toBe(2)
    expect(h.sender.worthClaiming()).toBe(true)
    let idle = false
    const waiting = h.sender.idle().then(() => {
      idle = true
    })
    for (const s of h.sent.slice(1, 6)) s.answer({ status: 200 })
    await settle()
    expect(idle).toBe(false)
    h.sent[6]!.answer({ status: 200 })
    await waiting
    expect(h.sender.room().free).toBe(8)
  })

  test("the room counts each account's deliveries on the way; while a receiver is slow, a chunk of the free slots is kept from those past their share", async () => {
    const h = harness(8)
    expect(h.sender.room()).toEqual({ free: 8, borrow: 8, share: 1, held: new Map() })
    for (let i = 1; i <= 3; i++) h.sender.send(claimed(i))
    h.sender.send(claimed(4, { accountId: 'account-2' }))
    await settle()
    expect(h.sender.room()).toEqual({ free: 4, borrow: 4, share: 1, held: new Map([['account-1', 3], ['account-2', 1]]) })
    expect(h.sender.worthBorrowing()).toBe(true)
    // A delivery out for more than a second: 4 free, 2 of them kept.
    h.elapsed.ms = 1_001
    expect(h.sender.room()).toMatchObject({ free: 4, borrow: 2 })
    h.sender.send(claimed(5))
    await settle()
    // 3 free: a claim for accounts within their share is worth it, one past it would find 1 slot.
    expect(h.sender.worthClaiming()).toBe(true)
    expect(h.sender.worthBorrowing()).toBe(false)
    h.sent[3]!.answer({ status: 200 })
    await settle()
    expect(h.sender.room().held).toEqual(new Map([['account-1', 4]]))
    // Every slow delivery back: the reserve stays for a minute.
    for (const i of [0, 1, 2, 4]) h.sent[i]!.answer({ status: 0 })
    await h.sender.idle()
    expect(h.sender.room()).toEqual({ free: 8, borrow: 6, share: 1, held: new Map() })
    h.elapsed.ms = 61_002
    expect(h.sender.room().borrow).toBe(8)
  })
})
