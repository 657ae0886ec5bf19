import { inArray } from 'drizzle-orm'
import type { Db } from '../../db/client'
import { webhooks } from '../../db/schema'
import { errorFields, logEvery } from '../../lib/log'
import { Claims } from './claim'
import { HostLoad } from './host-load'
import { type DispatcherContext, type DispatcherOptions, dispatcherSettings, type RunningDispatcher } from './options'
import { Purger } from '../../db/purger'
import { oldWebhookEvents, ownerlessDeliveries } from './purger'
import { Recorder } from './recorder'
import { Schedule } from './schedule'
import { Sender, type WebhookNow } from './sender'

/** How often the webhooks of deliveries that may wait behind a busy host are looked at again (Sender.withdraw). */
const RECHECK_EVERY_MS = 1_000

/** The webhooks of `ids` as they are now; a deleted one is missing. */
async function webhooksNow(db: Db, ids: string[]): Promise<Map<string, WebhookNow>> {
  const rows = await db.select({ id: webhooks.id, url: webhooks.url, enabled: webhooks.enabled }).from(webhooks).where(inArray(webhooks.id, ids))
  return new Map(rows.map(({ id, ...now }) => [id, now]))
}

/**
 * Delivers the outbox. On PostgreSQL it runs inside one of the delivery pool's workers, with a
 * connection of its own: claiming, signing, sending and recording cost the API thread nothing, and
 * that worker runs at the lowest CPU priority, so under a saturated CPU deliveries wait (unclaimed,
 * in PostgreSQL) and catch up when API requests leave CPU over. On embedded PGlite, which only the
 * main thread can open, the same code runs on the main thread and sends through the pool's workers.
 *
 * The parts, each safe with several instances on one database:
 * - Schedule: when a pass runs (commit wake-ups, the poll, spacing, giving way to API requests).
 * - Claims: a pass fans undispatched events out into deliveries and claims them; the exactly-once
 *   invariant across instances lives in its statements.
 * - Sender: signs and sends each claimed delivery on a worker, within maxInFlight, and counts what each
 *   account has on the way, by which the statements share the slots between accounts (Room).
 * - Recorder: writes attempted_at/http_status and the webhook's lastDelivery*, and hands back at stop
 *   what was cancelled before sending.
 * - Purger: deletes old events and their deliveries.
 *
 * Semantics: every event committed is attempted once per subscribed, enabled webhook, including
 * after a crash or restart between commit and send (the rows wait in PostgreSQL). There are no
 * retries: a timeout or refusal is an attempt (status 0). The one exception is a crash during the
 * send itself (claimed, result not recorded): a running instance renews the claims of what it has on
 * the way however long it waits, so only when the lease (2 minutes) of a stopped instance's claim
 * expires is the delivery attempted again: at least once only across a crash during the send.
 * Receivers can drop a repeat by (X-Service-Event, X-Service-Timestamp, body).
 */
export class WebhookDispatcher implements RunningDispatcher {
  readonly #ctx: DispatcherContext
  readonly #schedule: Schedule
  readonly #recorder: Recorder
  readonly #sender: Sender
  readonly #purgers: Purger[]
  readonly #renewEveryMs: number
  #renewal: ReturnType<typeof setInterval> | null = null
  #recheck: ReturnType<typeof setInterval> | null = null
  #rechecking = false

  constructor(ctx: DispatcherContext, options: DispatcherOptions = {}) {
    const settings = dispatcherSettings(options)
    this.#ctx = ctx
    // Four renewals a lease: a claim outlives a slow renewal or two, never a stopped instance by much.
    this.#renewEveryMs = (settings.leaseSeconds * 1000) / 4
    this.#recorder = new Recorder(ctx.db, ctx.recorded)
    this.#purgers = [new Purger(ctx.db, oldWebhookEvents(settings.retentionDays)), new Purger(ctx.db, ownerlessDeliveries)]
    const claims = new Claims(ctx.db, settings.fanOutBatch, settings.leaseSeconds)
    const sender = new Sender(ctx, this.#recorder, settings, (accountId) => {
      claims.freed(accountId, sender)
      if (claims.ready(sender)) this.#schedule.kick()
    })
    this.#sender = sender
    const load = settings.yieldAbove <= 1 ? new HostLoad(settings.yieldAbove, settings.yieldApiAbove) : null
    this.#schedule = new Schedule(
      { pollMs: settings.pollMs, minGapMs: settings.minGapMs, load, onCommit: (listener) => ctx.onCommit(listener) },
      {
        committed: () => claims.committed(),
        polled: () => claims.polled(),
        pass: () => claims.pass(sender),
        ready: () => claims.ready(sender),
      },
    )
  }

  start(): this {
    if (this.#schedule.running) return this
    this.#schedule.start()
    for (const purger of this.#purgers) purger.start()
    this.#renewal = setInterval(() => void this.#recorder.renew(), this.#renewEveryMs)
    this.#renewal.unref?.()
    this.#recheck = setInterval(() => void this.#withdrawChanged(), RECHECK_EVERY_MS)
    this.#recheck.unref?.()
    return this
  }

  /** Deliveries still queued whose webhook moved, or was disabled or deleted, since the claim go as it is now. */
  async #withdrawChanged(): Promise<void> {
    if (this.#rechecking) return
    const waiting = this.#sender.waiting()
    if (waiting.length === 0) return
    this.#rechecking = true
    try {
      this.#sender.withdraw(waiting, await webhooksNow(this.#ctx.db, waiting))
    } catch (err) {
      logEvery('warn', 'reading the webhooks of waiting deliveries failed; will retry', () => errorFields(err))
    } finally {
      this.#rechecking = false
    }
  }

  /** Stops taking work, then waits for deliveries on the workers and records their results. */
  async stop(): Promise<void> {
    if (!this.#schedule.running) return
    const pass = this.#schedule.stop()
    const purge = Promise.all(this.#purgers.map((purger) => purger.stop()))
    if (this.#renewal) clearInterval(this.#renewal)
    if (this.#recheck) clearInterval(this.#recheck)
    this.#recorder.stopping()
    this.#sender.stopping()
    await pass
    await purge
    // Claimed deliveries still queued behind busy receivers were never sent: hand them back.
    this.#ctx.cancelQueued()
    await this.#sender.idle()
    await this.#recorder.drain()
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.stop()
  }
}
