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
  /** The account of the webhook's app, whose deliveries on the way count against its share (Room). */
  accountId: string
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
 * event (`e`), its webhook (`w`) and the webhook's app (`a`) under the given aliases. Values are cast
 * to text/float8 so both drivers hand back the same JavaScript types. Constant text, so the
 * statements stay preparable.
 */
function claimedColumns(d: string, e: string, w: string, a: string): SQL {
  return sql.raw(
    `${d}.event_id::float8 AS event_id, ${d}.webhook_id, ${a}.account_id::text AS account_id, ${e}.event, ` +
      `${e}.data::text AS data, (extract(epoch FROM ${e}.occurred_at) * 1000)::float8 AS occurred_ms, ` +
      `${w}.url, ${w}.secret_enc, ${w}.enabled`,
  )
}

/**
 * What a statement may claim, and how it is shared between accounts (Sender.room). A receiver that
 * hangs holds each of its deliveries for 10 s: were the oldest due deliveries claimed whoever owns
 * them, one account's backlog to such a receiver would take every slot, and every other account's
 * deliveries would wait behind it. So each account's first `share` deliveries on the way (counting
 * those out already) are claimed first, oldest first, up to `free`; the rest, oldest first, only up
 * to `borrow` less what those took, which keeps `free - borrow` slots (the reserve, while a receiver
 * is slow: Sender) for accounts within their share.
 */
export interface Room {
  /** Slots free: the most one statement claims. */
  free: number
  /** At most `free`: the most a statement claims in all once it claims past an account's share. */
  borrow: number
  share: number
  /** Deliveries on the way by account; an account with none is left out. */
  held: ReadonlyMap<string, number>
}

/** A PostgreSQL array literal, one parameter whatever its length, so the statements stay preparable. */
const arrayLiteral = (values: Iterable<string | number>) => `{${[...values].join(',')}}`

/** Whether a delivery (under alias `d`) is owed and not claimed by a running instance. */
const due = (d: string, leaseSeconds: number) =>
  sql`${sql.raw(d)}.attempted_at IS NULL AND (${sql.raw(d)}.claimed_at IS NULL OR ${sql.raw(d)}.claimed_at < now() - make_interval(secs => ${leaseSeconds}))`

/**
 * The CTEs that pick which of `candidates` (event_id, webhook_id, account_id) to claim as `room`
 * allows: `numbered` holds each candidate with `fair` (within its account's share) and `chosen`.
 */
function choose(room: Room): SQL {
  return sql`
    held AS (
      SELECT * FROM unnest(${arrayLiteral(room.held.keys())}::uuid[], ${arrayLiteral(room.held.values())}::int[]) AS h(account_id, n)
    ), ranked AS (
      SELECT c.event_id, c.webhook_id, c.account_id,
             coalesce(h.n, 0) + row_number() OVER (PARTITION BY c.account_id ORDER BY c.event_id, c.webhook_id) <= ${room.share} AS fair
      FROM candidates c LEFT JOIN held h ON h.account_id = c.account_id
    ), ordered AS (
      SELECT event_id, webhook_id, account_id, fair,
             row_number() OVER (PARTITION BY fair ORDER BY event_id, webhook_id) AS n,
             count(*) FILTER (WHERE fair) OVER () AS fair_count
      FROM ranked
    ), numbered AS (
      SELECT event_id, webhook_id, account_id, fair,
             n <= CASE WHEN fair THEN ${room.free} ELSE ${room.borrow} - LEAST(fair_count, ${room.free}) END AS chosen
      FROM ordered
    ), tally AS (
      SELECT (count(*) FILTER (WHERE fair))::int AS within_share,
             (count(*) FILTER (WHERE fair AND NOT chosen))::int AS fair_left,
             (count(*) FILTER (WHERE NOT fair AND NOT chosen))::int AS borrowed_left,
             coalesce(string_agg(DISTINCT account_id::text, ',') FILTER (WHERE NOT fair AND NOT chosen), '') AS past_share
      FROM numbered
    )`
}

/** What a statement claimed, and what it saw and left. */
export interface Taken {
  claimed: Claimed[]
  /** Deliveries it saw within their accounts' shares. */
  withinShare: number
  /** Deliveries within their accounts' shares left for want of free slots. */
  fairLeft: number
  /** Deliveries past their accounts' shares left for want of `borrow`. */
  borrowedLeft: number
  /** The accounts of those. */
  pastShare: string[]
}

function taken(rows: Record<string, unknown>[]): Taken {
  return {
    claimed: rows.filter((r) => r.event_id !== null && r.event_id !== undefined).map(toClaimed),
    withinShare: Number(rows[0]?.within_share ?? 0),
    fairLeft: Number(rows[0]?.fair_left ?? 0),
    borrowedLeft: Number(rows[0]?.borrowed_left ?? 0),
    pastShare: String(rows[0]?.past_share ?? '').split(',').filter(Boolean),
  }
}

function toClaimed(r: Record<string, unknown>): Claimed {
  return {
    eventId: Number(r.event_id),
    webhookId: String(r.webhook_id),
    accountId: String(r.account_id),
    event: String(r.event),
    data: String(r.data),
    occurredAt: new Date(Math.round(Number(r.occurred_ms))),
    url: String(r.url),
    secretEnc: String(r.secret_enc),
    enabled: r.enabled === true || r.enabled === 't',
  }
}

export interface FannedOut extends Taken {
  /** Events marked dispatched. */
  events: number
}

/**
 * Takes up to `limit` undispatched events, marks them dispatched and writes one delivery per
 * webhook enabled and subscribed at this moment, those `room` allows already claimed by this
 * instance: one statement, no separate claim for them. The rest are written unclaimed.
 */
export async function fanOut(db: Db, limit: number, room: Room): Promise<FannedOut> {
  const result = await executePrepared(db, 'webhook_fan_out', sql`
    WITH picked AS (
      SELECT id, app_id, event, data, occurred_at FROM events
      WHERE dispatched_at IS NULL
      ORDER BY id
      LIMIT ${limit}
      FOR UPDATE SKIP LOCKED
    ), marked AS (
      UPDATE events SET dispatched_at = now() FROM picked WHERE events.id = picked.id
    ), candidates AS (
      -- Locked against a webhook's DELETE (the deliveries have no foreign key): one removed meanwhile is
      -- left out once it commits, and a DELETE that waited for this lock deletes the deliveries owed
      -- that were written here (deleteWebhook).
      SELECT p.id AS event_id, w.id AS webhook_id, a.account_id
      FROM picked p
      JOIN webhooks w ON w.app_id = p.app_id AND w.enabled AND p.event = ANY(w.events)
      JOIN apps a ON a.id = p.app_id
      FOR KEY SHARE OF w
    ), ${choose(room)}, owed AS (
      INSERT INTO webhook_deliveries (event_id, webhook_id, claimed_at)
      SELECT event_id, webhook_id, CASE WHEN chosen THEN now() END FROM numbered
      ON CONFLICT DO NOTHING
      RETURNING event_id, webhook_id, claimed_at
    ), counts AS (
      SELECT (SELECT count(*) FROM picked)::int AS events, t.* FROM tally t
    )
    SELECT counts.*, c.*
    FROM counts LEFT JOIN (
      SELECT ${claimedColumns('o', 'p', 'w', 'a')}
      FROM owed o
      JOIN picked p ON p.id = o.event_id
      JOIN webhooks w ON w.id = o.webhook_id
      JOIN apps a ON a.id = p.app_id
      WHERE o.claimed_at IS NOT NULL
    ) c ON true
    ORDER BY c.event_id`)
  const rows = rowsOf(result)
  return { events: Number(rows[0]?.events ?? 0), ...taken(rows) }
}

/**
 * Claims due deliveries (never attempted, and unclaimed or claimed longer than the lease ago: an
 * event with more webhooks than free slots, a crash, a shutdown's hand-back) as `room` allows, and
 * reads what sending them needs, in one statement. It looks at the oldest `room.free` due deliveries
 * and, while an account has its share on the way, at the oldest few of each webhook of the other
 * accounts (one index probe per webhook with deliveries owed): those are claimed first, and the
 * oldest due deliveries never hide them.
 */
/**
 * `queues(webhook_id)`, for a WITH RECURSIVE: each webhook with deliveries owed, once, walked one at a
 * time through webhook_deliveries_pending_by_webhook_idx (an index probe a webhook, not a read of every
 * delivery owed).
 */
export const pendingQueues = sql`queues(webhook_id) AS (
  (SELECT webhook_id FROM webhook_deliveries WHERE attempted_at IS NULL ORDER BY webhook_id LIMIT 1)
  UNION ALL
  SELECT (SELECT d.webhook_id FROM webhook_deliveries d
          WHERE d.attempted_at IS NULL AND d.webhook_id > q.webhook_id ORDER BY d.webhook_id LIMIT 1)
  FROM queues q WHERE q.webhook_id IS NOT NULL
)`

export async function claimDue(db: Db, room: Room, leaseSeconds: number): Promise<Taken> {
  const saturated = [...room.held].filter(([, n]) => n >= room.share).map(([accountId]) => accountId)
  const oldest = sql`oldest_due AS (
    SELECT d.event_id, d.webhook_id, a.account_id FROM webhook_deliveries d
    JOIN webhooks w ON w.id = d.webhook_id
    JOIN apps a ON a.id = w.app_id
    WHERE ${due('d', leaseSeconds)}
    ORDER BY d.event_id
    LIMIT ${room.free}
    FOR UPDATE OF d SKIP LOCKED
  )`
  // Each webhook's queue (webhook_deliveries_pending_by_webhook_idx), walked one webhook at a time; one
  // more than the share of each, so an account with more waiting is named in pastShare.
  const candidates =
    saturated.length === 0
      ? sql`${oldest}, candidates AS (SELECT * FROM oldest_due)`
      : sql`${oldest}, ${pendingQueues}, heads AS (
          SELECT x.event_id, x.webhook_id, a.account_id
          FROM queues q
          JOIN webhooks w ON w.id = q.webhook_id
          JOIN apps a ON a.id = w.app_id
          CROSS JOIN LATERAL (
            SELECT d.event_id, d.webhook_id FROM webhook_deliveries d
            WHERE d.webhook_id = q.webhook_id AND ${due('d', leaseSeconds)}
            ORDER BY d.event_id
            LIMIT ${room.share + 1}
            FOR UPDATE OF d SKIP LOCKED
          ) x
          WHERE NOT (a.account_id = ANY(${arrayLiteral(saturated)}::uuid[]))
        ), candidates AS (
          SELECT * FROM oldest_due UNION SELECT * FROM heads
        )`
  const result = await executePrepared(db, saturated.length === 0 ? 'webhook_claim' : 'webhook_claim_shared', sql`
    WITH RECURSIVE ${candidates}, ${choose(room)}, claimed AS (
      UPDATE webhook_deliveries d SET claimed_at = now()
      FROM numbered n WHERE n.chosen AND d.event_id = n.event_id AND d.webhook_id = n.webhook_id
      RETURNING d.event_id, d.webhook_id
    )
    SELECT t.*, c.*
    FROM tally t LEFT JOIN (
      SELECT ${claimedColumns('c', 'e', 'w', 'a')}
      FROM claimed c
      JOIN events e ON e.id = c.event_id
      JOIN webhooks w ON w.id = c.webhook_id
      JOIN apps a ON a.id = w.app_id
    ) c ON true
    ORDER BY c.event_id`)
  return taken(rowsOf(result))
}

/** Where claimed deliveries go, and how many it can take now. */
export interface Outlet {
  /** What a statement may claim now. */
  room(): Room
  /** Whether enough slots are free to make a statement worth running. */
  worthClaiming(): boolean
  /** The same, for deliveries past their accounts' shares, which never take the reserve. */
  worthBorrowing(): boolean
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
  /**
   * At start, on every poll and wake-up (new events may be any account's), and while fan-outs that saw
   * deliveries within their accounts' shares come back full: one takes as many events as slots are free.
   */
  #fanOutDue = true
  /**
   * While fan-outs that saw only deliveries past their accounts' shares come back full: one waits for
   * room to borrow and takes no more events than that, or it would write most of them unclaimed.
   */
  #fanOutBorrowDue = false
  /**
   * Set when a full fan-out saw only deliveries past their accounts' shares: the undispatched events in
   * front may all be such an account's, so the next one on a wake-up or poll takes a whole batch, to
   * reach the events of other accounts behind them (writing unclaimed what it cannot claim).
   */
  #reachPast = false
  /**
   * At start, on every poll, and after a statement that left deliveries within their accounts' shares
   * unclaimed (more webhooks than slots) or came back full.
   */
  #claimDue = true
  /** After a statement that left deliveries past their accounts' shares: claimed once `borrow` has room. */
  #borrowDue = false
  /** The accounts of those: theirs are within the share again once one of their deliveries comes back. */
  readonly #pastShare = new Set<string>()

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

  /** A delivery of the account came back. */
  freed(accountId: string, outlet: Outlet): void {
    if (!this.#pastShare.has(accountId)) return
    const { held, share } = outlet.room()
    if ((held.get(accountId) ?? 0) < share) this.#claimDue = true
  }

  /** Whether a pass now would run a statement with room for what is waiting. */
  ready(outlet: Outlet): boolean {
    return (
      ((this.#fanOutDue || this.#claimDue) && outlet.worthClaiming()) ||
      ((this.#fanOutBorrowDue || this.#borrowDue) && outlet.worthBorrowing())
    )
  }

  /**
   * Fans out undispatched events and claims their deliveries as the room allows, then (when due)
   * claims leftover deliveries. Returns whether more is waiting.
   */
  async pass(outlet: Outlet): Promise<boolean> {
    const wide = this.#fanOutDue && outlet.worthClaiming()
    if (wide || (this.#fanOutBorrowDue && outlet.worthBorrowing())) {
      this.#fanOutDue = false
      this.#fanOutBorrowDue = false
      const room = outlet.room()
      const limit = Math.min(this.#fanOutBatch, !wide ? room.borrow : this.#reachPast ? Infinity : room.free)
      const fanned = await fanOut(this.#db, limit, room)
      for (const c of fanned.claimed) outlet.send(c)
      // A full batch means more is waiting; deliveries written unclaimed are claimed below.
      const full = fanned.events >= limit
      this.#reachPast = full && fanned.withinShare === 0 && fanned.borrowedLeft > 0
      if (full && this.#reachPast) this.#fanOutBorrowDue = true
      else if (full) this.#fanOutDue = true
      this.#left(fanned)
    }
    if ((this.#claimDue && outlet.worthClaiming()) || (this.#borrowDue && outlet.worthBorrowing())) {
      this.#claimDue = false
      this.#borrowDue = false
      // The claim sees each account's oldest due deliveries: it names again those it leaves.
      this.#pastShare.clear()
      const room = outlet.room()
      const taken = await claimDue(this.#db, room, this.#leaseSeconds)
      for (const c of taken.claimed) outlet.send(c)
      // A full batch means more is waiting; otherwise the table is drained until the next wake-up.
      if (taken.claimed.length >= room.free) this.#claimDue = true
      this.#left(taken)
    }
    return this.#fanOutDue || this.#fanOutBorrowDue || this.#claimDue || this.#borrowDue
  }

  #left(taken: Taken): void {
    if (taken.fairLeft > 0) this.#claimDue = true
    if (taken.borrowedLeft > 0) this.#borrowDue = true
    for (const accountId of taken.pastShare) this.#pastShare.add(accountId)
  }
}
