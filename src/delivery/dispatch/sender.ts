import { errorFields, log } from '../../lib/log'
import { signedDelivery } from '../signed-delivery'
import type { DeliveryJob, DeliveryResult } from '../protocol'
import type { Claimed, Outlet, Room } from './claim'
import type { DispatcherContext } from './options'
import type { Recorder } from './recorder'

/** Where outcomes go: the recorder. */
export type Ledger = Pick<Recorder, 'take' | 'record' | 'handBack'>

/** Sealed values change only when a webhook is created; a bound keeps deleted ones from piling up. */
const MAX_SECRETS = 1_000

/** A delivery on the way longer than this means a receiver is slow (the reserve, Room in claim.ts). */
const SLOW_MS = 1_000
/** How long the reserve is kept after a delivery took that long: a receiver that hangs goes on hanging. */
const SLOW_MEMORY_MS = 60_000
/** A delivery out longer than this may be waiting behind its receiver's host: its webhook is looked at again (`waiting`). */
const RECHECK_AFTER_MS = 1_000

/** A webhook as it is now: where its deliveries go, and whether they go at all. */
export interface WebhookNow {
  url: string
  enabled: boolean
}

/**
 * Sends claimed deliveries: signs each and hands it to the pool (or this worker's queue), keeps
 * count of what is out, and passes every outcome to the recorder.
 */
export class Sender implements Outlet {
  readonly #ctx: Pick<DispatcherContext, 'send' | 'cancelQueued' | 'openSecret' | 'clock'>
  readonly #recorder: Ledger
  readonly #maxInFlight: number
  /** Free slots a claim waits for while deliveries are out; as many are kept for accounts within their share (Room). */
  readonly #claimChunk: number
  readonly #share: number
  /** Deliveries out by account; an account with none has no entry. */
  readonly #heldByAccount = new Map<string, number>()
  /** Each delivery out, with when it was sent (by `#now`), oldest first. */
  readonly #out = new Map<string, { at: number; claimed: Claimed }>()
  /**
   * Webhooks changed since deliveries of theirs still out were claimed (null: deleted), as the latest
   * `withdraw` that asked found them: those deliveries' queued jobs were cancelled, to be sent as the
   * webhook is now.
   */
  readonly #changed = new Map<string, WebhookNow | null>()
  /** Once stopping, a cancelled delivery is handed back instead of sent again. */
  #stopping = false
  /** Until when a delivery that was slow keeps the reserve. */
  #slowUntil = -Infinity
  /** Milliseconds of real time, for how long deliveries take (the context's clock may stand still in tests). */
  readonly #now: () => number
  /** Called whenever a delivery comes back and frees its slot, with its account. */
  readonly #onFreed: (accountId: string) => void
  #inFlight = 0
  #idle: (() => void)[] = []
  /** Opened webhook secrets by sealed value: opening one per delivery was a decryption (or a message) per event. */
  readonly #secrets = new Map<string, string>()

  constructor(
    ctx: Pick<DispatcherContext, 'send' | 'cancelQueued' | 'openSecret' | 'clock'>,
    recorder: Ledger,
    limits: { maxInFlight: number; perAccountShare: number },
    onFreed: (accountId: string) => void,
    now: () => number = () => performance.now(),
  ) {
    this.#ctx = ctx
    this.#recorder = recorder
    this.#maxInFlight = limits.maxInFlight
    this.#claimChunk = Math.max(1, Math.floor(limits.maxInFlight / 4))
    this.#share = limits.perAccountShare
    this.#onFreed = onFreed
    this.#now = now
  }

  get #free(): number {
    return this.#maxInFlight - this.#inFlight
  }

  /**
   * While a receiver is slow (a delivery on the way, or back within the last minute, that took more
   * than a second), deliveries past their accounts' shares leave a claim's chunk of the slots free, so a
   * claim for the others can always run. Otherwise they may take every slot: their receivers answer,
   * so the slots come back within moments, and they go to accounts within their share first.
   */
  get #borrow(): number {
    return this.#receiverSlow() ? Math.max(0, this.#free - this.#claimChunk) : this.#free
  }

  #receiverSlow(): boolean {
    const now = this.#now()
    if (now < this.#slowUntil) return true
    const oldest = this.#out.values().next()
    return !oldest.done && now - oldest.value.at > SLOW_MS
  }

  room(): Room {
    return { free: this.#free, borrow: this.#borrow, share: this.#share, held: this.#heldByAccount }
  }

  /**
   * While deliveries are out, a fan-out or claim waits for a chunk of free slots: under a backlog every
   * finished delivery would otherwise run a statement for one or two rows.
   */
  worthClaiming(): boolean {
    // While a receiver is slow its slots come back a few at a time, a timeout apart (16 a host every
    // 10 s): waiting for a chunk of them would keep other accounts' deliveries waiting several timeouts.
    return this.#receiverSlow() ? this.#free >= 1 : this.#worth(this.#free)
  }

  worthBorrowing(): boolean {
    return this.#worth(this.#borrow)
  }

  #worth(slots: number): boolean {
    return slots >= (this.#inFlight > 0 ? this.#claimChunk : 1)
  }

  /** Resolves once no delivery is out. */
  idle(): Promise<void> {
    if (this.#inFlight === 0) return Promise.resolve()
    return new Promise<void>((resolve) => this.#idle.push(resolve))
  }

  send(c: Claimed): void {
    if (this.#recorder.take(c)) this.#dispatch(c)
  }

  /** From now on a cancelled delivery is handed back: the dispatcher cancels what is queued to stop. */
  stopping(): void {
    this.#stopping = true
  }

  /** The webhooks of deliveries out for a while: ones that may wait behind a busy host, whose webhook may have changed since. */
  waiting(): string[] {
    const since = this.#now() - RECHECK_AFTER_MS
    const webhooks = new Set<string>()
    for (const { at, claimed } of this.#out.values()) {
      if (at > since) break
      webhooks.add(claimed.webhookId)
    }
    return [...webhooks]
  }

  /**
   * Takes the webhooks `waiting` named as they are now (`now`; one missing was deleted). The queued
   * deliveries of one whose URL changed, or that was disabled or deleted, since they were claimed are
   * cancelled, and come back to go where the webhook now says, or nowhere: a vendor that moves or
   * removes a webhook (a receiver it no longer trusts) is obeyed for what has not been sent yet, not
   * minutes later once a hanging host let the old claims through.
   */
  withdraw(asked: readonly string[], now: ReadonlyMap<string, WebhookNow>): void {
    const checked = new Set(asked)
    for (const webhookId of checked) this.#changed.delete(webhookId)
    const out = new Set<string>()
    const withdrawn = new Map<string, string | null>()
    for (const { claimed } of this.#out.values()) {
      out.add(claimed.webhookId)
      if (!checked.has(claimed.webhookId)) continue
      const current = now.get(claimed.webhookId) ?? null
      if (current !== null && current.enabled && current.url === claimed.url) continue
      this.#changed.set(claimed.webhookId, current)
      withdrawn.set(claimed.webhookId, current?.enabled ? current.url : null)
    }
    // Kept while anything of the webhook is out: a cancelled delivery that comes back after a later
    // check still goes as it says.
    for (const webhookId of this.#changed.keys()) if (!out.has(webhookId)) this.#changed.delete(webhookId)
    if (withdrawn.size > 0 && !this.#stopping) this.#ctx.cancelQueued(withdrawn)
  }

  #dispatch(c: Claimed): void {
    if (!c.enabled) {
      // Disabled (or deleted) after fan-out: close the row without sending, so re-enabling does not replay old events.
      this.#recorder.record({ eventId: c.eventId, webhookId: c.webhookId, at: new Date(this.#ctx.clock()), status: null })
      return
    }
    this.#inFlight++
    this.#heldByAccount.set(c.accountId, (this.#heldByAccount.get(c.accountId) ?? 0) + 1)
    const key = `${c.eventId} ${c.webhookId}`
    this.#out.set(key, { at: this.#now(), claimed: c })
    void this.#deliver(c).then((result) => {
      const now = this.#now()
      if (now - (this.#out.get(key)?.at ?? now) > SLOW_MS) this.#slowUntil = now + SLOW_MEMORY_MS
      this.#out.delete(key)
      this.#inFlight--
      const held = (this.#heldByAccount.get(c.accountId) ?? 1) - 1
      if (held > 0) this.#heldByAccount.set(c.accountId, held)
      else this.#heldByAccount.delete(c.accountId)
      if (result.reason !== 'cancelled') {
        this.#recorder.record({ eventId: c.eventId, webhookId: c.webhookId, at: new Date(this.#ctx.clock()), status: result.status })
      } else if (this.#stopping) {
        this.#recorder.handBack(c)
      } else {
        // Withdrawn while queued: it goes as its webhook now is.
        const current = this.#changed.get(c.webhookId)
        this.#dispatch(current === undefined ? c : current === null ? { ...c, enabled: false } : { ...c, ...current })
      }
      if (this.#inFlight === 0) for (const resolve of this.#idle.splice(0)) resolve()
      this.#onFreed(c.accountId)
    })
  }

  #deliver(c: Claimed): Promise<DeliveryResult> {
    const secret = this.#secrets.get(c.secretEnc)
    if (secret !== undefined) return this.#ctx.send(this.#job(c, secret))
    return this.#secret(c.secretEnc).then(
      (opened) => this.#ctx.send(this.#job(c, opened)),
      (err): DeliveryResult => {
        log.error('webhook secret could not be opened; delivery recorded without sending', {
          webhookId: c.webhookId,
          ...errorFields(err),
        })
        return { status: 0 }
      },
    )
  }

  #job(c: Claimed, secret: string): DeliveryJob {
    return { ...signedDelivery(c.url, secret, c.event, c.occurredAt, c.data), webhookId: c.webhookId }
  }

  async #secret(sealed: string): Promise<string> {
    const secret = await this.#ctx.openSecret(sealed)
    if (this.#secrets.size >= MAX_SECRETS) this.#secrets.clear()
    this.#secrets.set(sealed, secret)
    return secret
  }
}
