import { errorFields, log } from '../../lib/log'
import { signedDelivery } from '../signed-delivery'
import type { DeliveryResult } from '../protocol'
import type { Claimed, Outlet } from './claim'
import type { DispatcherContext } from './options'
import type { Recorder } from './recorder'

/** Where outcomes go: the recorder. */
export type Ledger = Pick<Recorder, 'take' | 'record' | 'handBack'>

/** Sealed values change only when a webhook is created; a bound keeps deleted ones from piling up. */
const MAX_SECRETS = 1_000

/**
 * Sends claimed deliveries: signs each and hands it to the pool (or this worker's queue), keeps
 * count of what is out, and passes every outcome to the recorder.
 */
export class Sender implements Outlet {
  readonly #ctx: Pick<DispatcherContext, 'send' | 'openSecret' | 'clock'>
  readonly #recorder: Ledger
  readonly #maxInFlight: number
  /** Free slots a claim waits for while deliveries are out. */
  readonly #claimChunk: number
  /** Called whenever a delivery comes back and frees its slot. */
  readonly #onFreed: () => void
  #inFlight = 0
  #idle: (() => void)[] = []
  /** Opened webhook secrets by sealed value: opening one per delivery was a decryption (or a message) per event. */
  readonly #secrets = new Map<string, string>()

  constructor(
    ctx: Pick<DispatcherContext, 'send' | 'openSecret' | 'clock'>,
    recorder: Ledger,
    maxInFlight: number,
    onFreed: () => void,
  ) {
    this.#ctx = ctx
    this.#recorder = recorder
    this.#maxInFlight = maxInFlight
    this.#claimChunk = Math.max(1, Math.floor(maxInFlight / 4))
    this.#onFreed = onFreed
  }

  get free(): number {
    return this.#maxInFlight - this.#inFlight
  }

  /**
   * While deliveries are out, a fan-out or claim waits for a chunk of free slots: under a backlog every
   * finished delivery would otherwise run a statement for one or two rows.
   */
  worthClaiming(): boolean {
    return this.free >= (this.#inFlight > 0 ? this.#claimChunk : 1)
  }

  /** Resolves once no delivery is out. */
  idle(): Promise<void> {
    if (this.#inFlight === 0) return Promise.resolve()
    return new Promise<void>((resolve) => this.#idle.push(resolve))
  }

  send(c: Claimed): void {
    if (!this.#recorder.take(c)) return
    if (!c.enabled) {
      // Disabled after fan-out: close the row without sending, so re-enabling does not replay old events.
      this.#recorder.record({ eventId: c.eventId, webhookId: c.webhookId, at: new Date(this.#ctx.clock()), status: null })
      return
    }
    this.#inFlight++
    void this.#deliver(c).then((result) => {
      if (result.reason === 'cancelled') this.#recorder.handBack(c)
      else this.#recorder.record({ eventId: c.eventId, webhookId: c.webhookId, at: new Date(this.#ctx.clock()), status: result.status })
      this.#inFlight--
      if (this.#inFlight === 0) for (const resolve of this.#idle.splice(0)) resolve()
      this.#onFreed()
    })
  }

  #deliver(c: Claimed): Promise<DeliveryResult> {
    const secret = this.#secrets.get(c.secretEnc)
    if (secret !== undefined) return this.#ctx.send(signedDelivery(c.url, secret, c.event, c.occurredAt, c.data))
    return this.#secret(c.secretEnc).then(
      (opened) => this.#ctx.send(signedDelivery(c.url, opened, c.event, c.occurredAt, c.data)),
      (err): DeliveryResult => {
        log.error('webhook secret could not be opened; delivery recorded without sending', {
          webhookId: c.webhookId,
          ...errorFields(err),
        })
        return { status: 0 }
      },
    )
  }

  async #secret(sealed: string): Promise<string> {
    const secret = await this.#ctx.openSecret(sealed)
    if (this.#secrets.size >= MAX_SECRETS) this.#secrets.clear()
    this.#secrets.set(sealed, secret)
    return secret
  }
}
