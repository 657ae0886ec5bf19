import { type SQL, sql } from 'drizzle-orm'
import type { Db } from '../../db/client'
import { executePrepared, rowsOf } from '../prepared'

/**
 * Fan-out and claim: turning outbox events into deliveries, and taking deliveries for this instance.
 *
 * Exactly once across instances lives here, in the two statements, and nowhere else: every row a
 * statement hands back was locked FOR UPDATE SKIP LOCKED and stamped (events.dispatched_at,
 * webhook_deliveries.claimed_at) in the same statement, so two instances on one database never get
 * the same event or delivery, and ON CONFLICT DO NOTHING keeps an event fanned out twice (after a
 * crash) from owing a delivery twice. A lease taken over after `leaseSeconds` is the one way a
 * delivery is handed out again: a crash during the send (at least once only then). Within this
 * instance the recorder's ledger keeps an expired claim of its own from being sent twice.
 */

/** A claimed delivery with what sending it needs. */
export interface Claimed {
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

export interface FannedOut {
  /** Events marked dispatched. */
  events: number
  /** Deliveries written unclaimed (beyond `limit`): the claim statement takes them. */
  unclaimed: number
  claimed: Claimed[]
}

/**
 * Takes up to `limit` undispatched events, marks them dispatched and writes one delivery per
 * webhook enabled and subscribed at this moment, the first `limit` of them already claimed by this
 * instance: one statement, no separate claim for them.
 */
export async function fanOut(db: Db, limit: number): Promise<FannedOut> {
  const result = await executePrepared(db, 'webhook_fan_out', sql`
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

/**
 * Claims up to `limit` due deliveries (never attempted, and unclaimed or claimed longer than the
 * lease ago: an event with more webhooks than free slots, a crash, a shutdown's hand-back) and reads
 * what sending them needs, in one statement.
 */
export async function claimDue(db: Db, limit: number, leaseSeconds: number): Promise<Claimed[]> {
  const result = await executePrepared(db, 'webhook_claim', sql`
    WITH due AS (
      SELECT event_id, webhook_id FROM webhook_deliveries
      WHERE attempted_at IS NULL
        AND (claimed_at IS NULL OR claimed_at < now() - make_interval(secs => ${leaseSeconds}))
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

/** Where claimed deliveries go, and how many it can take now. */
export interface Outlet {
  /** Slots free for deliveries. */
  readonly free: number
  /** Whether enough slots are free to make a statement worth running. */
  worthClaiming(): boolean
  send(claimed: Claimed): void
}

/**
 * Which of the two statements a pass owes, and the pass that runs them. The flags are cleared
 * before their statement, so a commit during it (or a failure) asks for one more.
 */
export class Claims {
  readonly #db: Db
  readonly #fanOutBatch: number
  readonly #leaseSeconds: number
  /** At start, on every poll and wake-up, and while fan-outs come back full. */
  #fanOutDue = true
  /** At start, on every poll, after a fan-out that left deliveries unclaimed, and while claims come back full. */
  #claimDue = true

  constructor(db: Db, fanOutBatch: number, leaseSeconds: number) {
    this.#db = db
    this.#fanOutBatch = fanOutBatch
    this.#leaseSeconds = leaseSeconds
  }

  /** A commit wrote events. */
  committed(): void {
    this.#fanOutDue = true
  }

  /** The poll: look for other instances' leftovers and expired leases too. */
  polled(): void {
    this.#fanOutDue = true
    this.#claimDue = true
  }

  get due(): boolean {
    return this.#fanOutDue || this.#claimDue
  }

  /**
   * Fans out undispatched events and claims their deliveries up to the free slots, then (when due)
   * claims leftover deliveries. Returns whether more is waiting.
   */
  async pass(outlet: Outlet): Promise<boolean> {
    if (this.#fanOutDue && outlet.worthClaiming()) {
      this.#fanOutDue = false
      const limit = Math.min(this.#fanOutBatch, outlet.free)
      const fanned = await fanOut(this.#db, limit)
      for (const c of fanned.claimed) outlet.send(c)
      // A full batch means more is waiting; unclaimed deliveries (more webhooks than slots) are claimed below.
      if (fanned.events >= limit) this.#fanOutDue = true
      if (fanned.unclaimed > 0) this.#claimDue = true
    }
    if (this.#claimDue && outlet.worthClaiming()) {
      this.#claimDue = false
      const room = outlet.free
      const claimed = await claimDue(this.#db, room, this.#leaseSeconds)
      for (const c of claimed) outlet.send(c)
      // A full batch means more is waiting; otherwise the table is drained until the next wake-up.
      if (claimed.length >= room) this.#claimDue = true
    }
    return this.due
  }
}
