import { type SQL, sql } from 'drizzle-orm'
import type { Db } from '../db/client'
import type { Context } from '../context'
import { errorFields, log, logEvery } from '../lib/log'
import { signedDelivery } from './payload'
import { executePrepared } from './prepared'
import type { DeliveryJob, DeliveryResult } from './protocol'
import { HostLoad } from './load'
import { type Attempt, recordAttempts } from './record'

/**
 * Delivers the outbox. On PostgreSQL it runs inside one of the delivery pool's workers, with a
 * connection of its own: claiming, signing, sending and recording cost the API thread nothing, and
 * that worker runs at the lowest CPU priority, so under a saturated CPU deliveries wait (unclaimed,
 * in PostgreSQL) and catch up when API requests leave CPU over. On embedded PGlite, which only the
 * main thread can open, the same code runs on the main thread and sends through the pool's workers.
 *
 * Each step is safe with several instances on one database:
 * 1. Fan-out: recordEvents writes only the events. After a commit's wake-up (and on every poll) the
 *    fan-out statement takes as many undispatched events as there are free slots, SKIP LOCKED,
 *    marks them dispatched and writes one webhook_deliveries row per webhook enabled and subscribed
 *    at that moment, inserted already claimed by this instance (up to its free slots): one
 *    statement, no separate claim for them.
 * 2. Claim: every other due delivery (never attempted, and unclaimed or claimed longer than the
 *    lease ago: an event with more webhooks than free slots, a crash, a shutdown's hand-back) gets
 *    claimed_at = now() with SKIP LOCKED by the claim statement, on the poll. Either way exactly one
 *    instance sends each.
 * 3. Send on a worker, then record attempted_at/http_status and the webhook's lastDelivery*.
 *
 * While API requests are short of CPU (yieldAbove) only the poll runs steps 1 and 2, once per
 * pollMs: the events wait undispatched in PostgreSQL, costing it one row each, and are sent once the
 * load drops.
 *
 * Semantics: every event committed is attempted once per subscribed, enabled webhook, including
 * after a crash or restart between commit and send (the rows wait in PostgreSQL). There are no
 * retries: a timeout or refusal is an attempt (status 0). The one exception is a crash during the
 * send itself (claimed, result not recorded): when the lease (2 minutes) expires the delivery is
 * attempted again, so it is at least once only across a crash during the send. Receivers can drop a
 * repeat by (X-Service-Event, X-Service-Timestamp, body).
 */

export interface DispatcherOptions {
  /** How often to look for work from other instances (and missed wake-ups). */
  pollMs?: number
  /**
   * A claim older than this is taken over. It must exceed the longest a claimed delivery can wait:
   * a full claim queued behind hanging receivers (maxInFlight / worker slots × 10 s) plus recording.
   */
  leaseSeconds?: number
  /** Most events fanned out per statement (fewer when fewer slots are free). */
  fanOutBatch?: number
  /** Deliveries this instance has on the workers at once. */
  maxInFlight?: number
  /**
   * Least time between two passes. Writers wake the dispatcher after every commit (validate's batch
   * every few ms); coalescing wake-ups keeps the database work per event small under load.
   */
  minGapMs?: number
  /** Dispatched events whose deliveries are all attempted are deleted after this many days. */
  retentionDays?: number
  /**
   * Host CPU share (0–1) of non-background work from which deliveries give way, when the API thread
   * is busy too (yieldApiAbove): then commits no longer wake the dispatcher and only the poll fans
   * out and claims (up to maxInFlight per pollMs), so API requests keep the CPU and the database; the
   * events wait undispatched in PostgreSQL and are sent when the load drops. Above 1 turns this off.
   */
  yieldAbove?: number
  /** The API thread's share of one CPU (0–1) from which it counts as busy; see yieldAbove. */
  yieldApiAbove?: number
}

/** What the dispatcher runs on: the main thread's ctx (PGlite) or a delivery worker's own (PostgreSQL). */
export interface DispatcherContext {
  db: Db
  /** Sends one prepared delivery; never rejects. */
  send(job: DeliveryJob): Promise<DeliveryResult>
  /** Answers every delivery still queued (not sent) with reason 'cancelled'. */
  cancelQueued(): void
  /** Opens a sealed webhook secret; throws when it cannot be opened. */
  openSecret(sealed: string): Promise<string>
  /** Calls the listener after every commit that wrote events; returns the unsubscribe. */
  onCommit(listener: () => void): () => void
  clock: () => number
}

/** A started dispatcher, in this thread or in a delivery worker. */
export interface RunningDispatcher {
  /** Stops taking work, then waits for deliveries on the way and records their results. */
  stop(): Promise<void>
  [Symbol.asyncDispose](): Promise<void>
}

interface Claimed {
  eventId: number
  webhookId: string
  event: string
  /** The event's data as JSON text, as PostgreSQL prints jsonb: it goes into the body as it is. */
  data: string
  occurredAt: Date
  url: string
  secretEnc: string
  enabled: boolean
}

const CLEANUP_EVERY_MS = 10 * 60_000
const PURGE_BATCH = 5_000
const PURGE_MAX_BATCHES = 100
const FLUSH_DELAY_MS = 100
const RECORD_BATCH = 1_000
/** Gap between passes while a backlog drains (wake-ups from commits use minGapMs). */
const BACKLOG_GAP_MS = 5

/**
 * The select list both claiming statements return and toClaimed reads, over a delivery (`d`), its
 * event (`e`) and its webhook (`w`) under the given aliases. Values are cast to text/float8 so both
 * drivers hand back the same JavaScript types. Constant text, so the statements stay preparable.
 */
function claimedColumns(d: string, e: string, w: string): SQL {
  return sql.raw(
    `${d}.event_id::float8 AS event_id, ${d}.webhook_id, ${e}.event, ${e}.data::text AS data, ` +
      `(extract(epoch FROM ${e}.occurred_at) * 1000)::float8 AS occurred_ms, ` +
      `${w}.url, ${w}.secret_enc, ${w}.enabled`,
  )
}

function toClaimed(r: Record<string, unknown>): Claimed {
  return {
    eventId: Number(r.event_id),
    webhookId: String(r.webhook_id),
    event: String(r.event),
    data: String(r.data),
    occurredAt: new Date(Math.round(Number(r.occurred_ms))),
    url: String(r.url),
    secretEnc: String(r.secret_enc),
    enabled: r.enabled === true || r.enabled === 't',
  }
}

function rowsOf(result: unknown): Record<string, unknown>[] {
  // postgres.js returns the rows themselves, PGlite an object holding them.
  return (Array.isArray(result) ? result : (result as { rows?: unknown[] }).rows ?? []) as Record<string, unknown>[]
}

export class WebhookDispatcher implements RunningDispatcher {
  readonly #ctx: DispatcherContext
  readonly #db: Db
  readonly #pollMs: number
  readonly #leaseSeconds: number
  readonly #fanOutBatch: number
  readonly #maxInFlight: number
  readonly #retentionDays: number
  readonly #minGapMs: number
  /** Free worker slots a claim waits for while deliveries are out. */
  readonly #claimChunk: number
  readonly #load: HostLoad | null

  #unsubscribe: (() => void) | null = null
  #poll: ReturnType<typeof setInterval> | null = null
  #cleanup: ReturnType<typeof setInterval> | null = null
  #stopped = true
  #pumping: Promise<void> | null = null
  #again = false
  #backlog = false
  /** Whether the fan-out statement should run: at start, on every poll and wake-up, and while it finds full batches. */
  #fanOutDue = true
  /**
   * Whether the claim statement should run: at start, on every poll, after a fan-out that left
   * deliveries unclaimed, and while claims come back full.
   */
  #claimDue = true
  /** The next pass was asked for by the poll: it runs even while the host is saturated. */
  #pollPass = true
  #lastPass = 0
  #delayed: ReturnType<typeof setTimeout> | null = null
  #inFlight = 0
  #idle: (() => void)[] = []
  #results: Attempt[] = []
  /** Deliveries this instance claimed and has not recorded yet ("eventId webhookId"). */
  readonly #owned = new Set<string>()
  /** Claimed deliveries cancelled at shutdown before they were sent. */
  #released: { eventId: number; webhookId: string }[] = []
  #flushing: Promise<void> | null = null
  /** Opened webhook secrets by sealed value: opening one per delivery was a decryption (or a message) per event. */
  readonly #secrets = new Map<string, string>()
  #purging: Promise<void> | null = null

  constructor(ctx: DispatcherContext, options: DispatcherOptions = {}) {
    this.#ctx = ctx
    this.#db = ctx.db
    this.#pollMs = options.pollMs ?? 1_000
    this.#leaseSeconds = options.leaseSeconds ?? 120
    this.#fanOutBatch = options.fanOutBatch ?? 500
    this.#maxInFlight = options.maxInFlight ?? 256
    this.#minGapMs = options.minGapMs ?? 50
    this.#retentionDays = options.retentionDays ?? 7
    this.#claimChunk = Math.max(1, Math.floor(this.#maxInFlight / 4))
    const yieldAbove = options.yieldAbove ?? 0.7
    this.#load = yieldAbove <= 1 ? new HostLoad(yieldAbove, options.yieldApiAbove ?? 0.25) : null
  }

  start(): this {
    if (!this.#stopped) return this
    this.#stopped = false
    this.#unsubscribe = this.#ctx.onCommit(() => {
      this.#fanOutDue = true
      this.kick()
    })
    this.#poll = setInterval(() => {
      this.#fanOutDue = true
      this.#claimDue = true
      this.#pollPass = true
      this.kick()
    }, this.#pollMs)
    this.#cleanup = setInterval(() => this.#startPurge(), CLEANUP_EVERY_MS)
    this.#poll.unref?.()
    this.#cleanup.unref?.()
    this.kick()
    this.#startPurge()
    return this
  }

  /** Stops taking work, then waits for deliveries on the workers and records their results. */
  async stop(): Promise<void> {
    if (this.#stopped) return
    this.#stopped = true
    this.#unsubscribe?.()
    if (this.#poll) clearInterval(this.#poll)
    if (this.#delayed) clearTimeout(this.#delayed)
    if (this.#cleanup) clearInterval(this.#cleanup)
    await this.#pumping
    await this.#purging
    // Claimed deliveries still queued behind busy receivers were never sent: hand them back.
    this.#ctx.cancelQueued()
    if (this.#inFlight > 0) await new Promise<void>((resolve) => this.#idle.push(resolve))
    this.#flush()
    await this.#flushing
    await this.#release()
  }

  /** Clears the claims of deliveries cancelled before sending, so the next start sends them at once. */
  async #release(): Promise<void> {
    if (this.#released.length === 0) return
    const rows = this.#released.splice(0).map((r) => ({ event_id: r.eventId, webhook_id: r.webhookId }))
    try {
      await this.#db.execute(sql`
        UPDATE webhook_deliveries AS d SET claimed_at = NULL
        FROM jsonb_to_recordset(${JSON.stringify(rows)}::jsonb) AS r(event_id bigint, webhook_id text)
        WHERE d.event_id = r.event_id AND d.webhook_id = r.webhook_id AND d.attempted_at IS NULL`)
    } catch (err) {
      // Their lease runs out instead: still sent once, only later.
      log.warn('could not hand back unsent webhook deliveries', errorFields(err))
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.stop()
  }

  /** Looks for work now (called on every commit that wrote events, and by the poll). */
  kick(): void {
    if (this.#stopped) return
    if (this.#pumping) {
      this.#again = true
      return
    }
    if (this.#delayed) return
    const wait = this.#lastPass + (this.#backlog ? BACKLOG_GAP_MS : this.#minGapMs) - performance.now()
    if (wait > 0) {
      this.#delayed = setTimeout(() => {
        this.#delayed = null
        this.kick()
      }, wait)
      return
    }
    this.#lastPass = performance.now()
    this.#pumping = this.#pump().finally(() => {
      this.#pumping = null
      // Wake-ups that came in during the pass are served by one more (spaced) pass.
      if (this.#again || (this.#backlog && this.#roomForClaim())) this.kick()
    })
  }

  /**
   * One pass: undispatched events are fanned out and claimed up to the free worker slots, then (when
   * due) leftover deliveries are claimed: expired leases, other instances' leftovers, hand-backs.
   */
  async #pump(): Promise<void> {
    this.#again = false
    const polled = this.#pollPass
    this.#pollPass = false
    if (!polled && this.#load?.saturated()) {
      // Giving way to API requests: the poll's next pass claims what is due (see yieldAbove).
      this.#backlog = false
      return
    }
    try {
      if (this.#fanOutDue && this.#roomForClaim()) {
        // Cleared first: a commit during the statement asks for one more pass.
        this.#fanOutDue = false
        const limit = Math.min(this.#fanOutBatch, this.#maxInFlight - this.#inFlight)
        const fanned = await this.#fanOut(limit)
        for (const c of fanned.claimed) this.#send(c)
        // A full batch means more is waiting; unclaimed deliveries (more webhooks than slots) are claimed below.
        if (fanned.events >= limit) this.#fanOutDue = true
        if (fanned.unclaimed > 0) this.#claimDue = true
      }
      if (this.#claimDue && this.#roomForClaim()) {
        this.#claimDue = false
        const room = this.#maxInFlight - this.#inFlight
        const claimed = await this.#claim(room)
        for (const c of claimed) this.#send(c)
        // A full batch means more is waiting; otherwise the table is drained until the next wake-up.
        if (claimed.length >= room) this.#claimDue = true
      }
      this.#backlog = this.#fanOutDue || this.#claimDue
    } catch (err) {
      // The poll asks again (a claim cleared before its failed statement included).
      this.#backlog = false
      logEvery('error', 'webhook dispatch failed; retrying on the next poll', () => errorFields(err))
    }
  }

  /**
   * While deliveries are out, a fan-out or claim waits for a chunk of free slots: under a backlog every
   * finished delivery would otherwise run a statement for one or two rows.
   */
  #roomForClaim(): boolean {
    const room = this.#maxInFlight - this.#inFlight
    return room >= (this.#inFlight > 0 ? this.#claimChunk : 1)
  }

  /** Fans out up to `limit` events, claiming up to `limit` of their deliveries, in one statement. */
  async #fanOut(limit: number): Promise<{ events: number; unclaimed: number; claimed: Claimed[] }> {
    const result = await executePrepared(this.#db, 'webhook_fan_out', sql`
      WITH picked AS (
        SELECT id, app_id, event, data, occurred_at FROM events
        WHERE dispatched_at IS NULL
        ORDER BY id
        LIMIT ${limit}
        FOR UPDATE SKIP LOCKED
      ), marked AS (
        UPDATE events SET dispatched_at = now() FROM picked WHERE events.id = picked.id
      ), pairs AS (
        SELECT p.id AS event_id, w.id AS webhook_id, row_number() OVER (ORDER BY p.id, w.id) AS n
        FROM picked p
        JOIN webhooks w ON w.app_id = p.app_id AND w.enabled AND p.event = ANY(w.events)
      ), owed AS (
        INSERT INTO webhook_deliveries (event_id, webhook_id, claimed_at)
        SELECT event_id, webhook_id, CASE WHEN n <= ${limit} THEN now() END FROM pairs
        ON CONFLICT DO NOTHING
        RETURNING event_id, webhook_id, claimed_at
      ), counts AS (
        SELECT (SELECT count(*) FROM picked)::int AS events,
               (SELECT count(*) FROM owed WHERE claimed_at IS NULL)::int AS unclaimed
      )
      SELECT counts.events, counts.unclaimed, c.*
      FROM counts LEFT JOIN (
        SELECT ${claimedColumns('o', 'p', 'w')}
        FROM owed o
        JOIN picked p ON p.id = o.event_id
        JOIN webhooks w ON w.id = o.webhook_id
        WHERE o.claimed_at IS NOT NULL
      ) c ON true
      ORDER BY c.event_id`)
    const rows = rowsOf(result)
    return {
      events: Number(rows[0]?.events ?? 0),
      unclaimed: Number(rows[0]?.unclaimed ?? 0),
      claimed: rows.filter((r) => r.event_id !== null && r.event_id !== undefined).map(toClaimed),
    }
  }

  /** Claims due deliveries and reads what sending them needs, in one statement. */
  async #claim(limit: number): Promise<Claimed[]> {
    const result = await executePrepared(this.#db, 'webhook_claim', sql`
      WITH due AS (
        SELECT event_id, webhook_id FROM webhook_deliveries
        WHERE attempted_at IS NULL
          AND (claimed_at IS NULL OR claimed_at < now() - make_interval(secs => ${this.#leaseSeconds}))
        ORDER BY event_id
        LIMIT ${limit}
        FOR UPDATE SKIP LOCKED
      ), claimed AS (
        UPDATE webhook_deliveries d SET claimed_at = now()
        FROM due WHERE d.event_id = due.event_id AND d.webhook_id = due.webhook_id
        RETURNING d.event_id, d.webhook_id
      )
      SELECT ${claimedColumns('c', 'e', 'w')}
      FROM claimed c
      JOIN events e ON e.id = c.event_id
      JOIN webhooks w ON w.id = c.webhook_id
      ORDER BY c.event_id`)
    return rowsOf(result).map(toClaimed)
  }

  #send(c: Claimed): void {
    const key = `${c.eventId} ${c.webhookId}`
    // Our own claim that expired while queued or unrecorded (a saturated CPU, a database outage):
    // re-claiming only extended the lease; sending it again would be a duplicate.
    if (this.#owned.has(key)) return
    this.#owned.add(key)
    if (!c.enabled) {
      // Disabled after fan-out: close the row without sending, so re-enabling does not replay old events.
      this.#results.push({ eventId: c.eventId, webhookId: c.webhookId, at: new Date(this.#ctx.clock()), status: null })
      this.#flush()
      return
    }
    this.#inFlight++
    const secret = this.#secrets.get(c.secretEnc)
    const sending =
      secret !== undefined
        ? this.#ctx.send(signedDelivery(c.url, secret, c.event, c.occurredAt, c.data))
        : this.#secret(c.secretEnc).then(
            (opened) => this.#ctx.send(signedDelivery(c.url, opened, c.event, c.occurredAt, c.data)),
            (err): DeliveryResult => {
              log.error('webhook secret could not be opened; delivery recorded without sending', {
                webhookId: c.webhookId,
                ...errorFields(err),
              })
              return { status: 0 }
            },
          )
    void sending.then((result: DeliveryResult) => {
      if (result.reason === 'cancelled') {
        this.#released.push({ eventId: c.eventId, webhookId: c.webhookId })
        this.#owned.delete(key)
      } else {
        this.#results.push({ eventId: c.eventId, webhookId: c.webhookId, at: new Date(this.#ctx.clock()), status: result.status })
      }
      this.#inFlight--
      this.#flush()
      if (this.#inFlight === 0) for (const resolve of this.#idle.splice(0)) resolve()
      if ((this.#fanOutDue || this.#claimDue) && this.#roomForClaim()) this.kick()
    })
  }

  async #secret(sealed: string): Promise<string> {
    const secret = await this.#ctx.openSecret(sealed)
    // Sealed values change only when a webhook is created; a bound keeps deleted ones from piling up.
    if (this.#secrets.size >= 1_000) this.#secrets.clear()
    this.#secrets.set(sealed, secret)
    return secret
  }

  /** Records finished attempts in batches; one write in flight at a time, later results queue up. */
  #flush(): void {
    if (this.#flushing || this.#results.length === 0) return
    this.#flushing = (async () => {
      // Results arrive one by one: a short wait turns them into one statement per batch.
      if (!this.#stopped) await Bun.sleep(FLUSH_DELAY_MS)
      let failures = 0
      while (this.#results.length > 0) {
        const batch = this.#results.splice(0, RECORD_BATCH)
        try {
          await recordAttempts(this.#db, batch)
          for (const a of batch) this.#owned.delete(`${a.eventId} ${a.webhookId}`)
          failures = 0
          // What arrived during the write waits for the next batch (after the delay), unless a full
          // batch is already there: back-to-back statements of a few rows each cost the most.
          if (!this.#stopped && this.#results.length < RECORD_BATCH) break
        } catch (err) {
          failures++
          logEvery('error', 'recording webhook attempts failed', () => errorFields(err))
          // Unrecorded results are re-sent after the lease: keep trying while running, give up when stopping.
          if (this.#stopped && failures >= 3) return
          this.#results.unshift(...batch)
          await Bun.sleep(Math.min(5_000, 200 * 2 ** failures))
        }
      }
    })().finally(() => {
      this.#flushing = null
      if (this.#results.length > 0 && !this.#stopped) this.#flush()
    })
  }

  #startPurge(): void {
    this.#purging ??= this.#purge().finally(() => {
      this.#purging = null
    })
  }

  /**
   * Deletes old events and, in the same statement, their deliveries (no foreign key cascades them).
   * Ids grow with time, so each batch looks only at the oldest rows through the primary key instead
   * of scanning a table that can be large.
   */
  async #purge(): Promise<void> {
    try {
      for (let batch = 0; batch < PURGE_MAX_BATCHES && !this.#stopped; batch++) {
        const result = await this.#db.execute(sql`
          WITH oldest AS (SELECT id FROM events ORDER BY id LIMIT ${PURGE_BATCH}),
          gone AS (
            DELETE FROM events e USING oldest
            WHERE e.id = oldest.id
              AND e.dispatched_at < now() - make_interval(days => ${this.#retentionDays})
              AND NOT EXISTS (
                SELECT 1 FROM webhook_deliveries d WHERE d.event_id = e.id AND d.attempted_at IS NULL
              )
            RETURNING e.id
          ), deliveries AS (
            DELETE FROM webhook_deliveries d USING gone WHERE d.event_id = gone.id
          )
          SELECT count(*)::int AS n FROM gone`)
        if (Number(rowsOf(result)[0]?.n ?? 0) < PURGE_BATCH) break
      }
    } catch (err) {
      log.warn('purging old webhook events failed', errorFields(err))
    }
  }

}

/**
 * Starts delivering the outbox with the given dependencies; stop() before closing the database. On
 * PostgreSQL the dispatcher runs in one of ctx.webhookPool's workers (with the pool's delivery
 * settings); on PGlite on this thread, sending through the pool.
 */
export function startDispatcher(ctx: Context, options: DispatcherOptions = {}): RunningDispatcher {
  const url = ctx.database.url
  if (url) return ctx.webhookPool.dispatch(url, options, ctx)
  ctx.webhookPool.start()
  const pool = ctx.webhookPool
  return new WebhookDispatcher(
    {
      db: ctx.database.db,
      send: (job) => pool.send(job),
      cancelQueued: () => pool.cancelQueued(),
      openSecret: async (sealed) => ctx.sealer.open(sealed).toString('utf8'),
      onCommit: (listener) => ctx.bus.subscribe(listener),
      clock: ctx.clock,
    },
    options,
  ).start()
}
