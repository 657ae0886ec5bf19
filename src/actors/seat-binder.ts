import { and, eq, sql } from 'drizzle-orm'
import { licenses } from '../db/schema'
import { PublicError } from '../lib/errors'
import { log } from '../lib/log'
import { type DomainEvent, recordEvents } from '../delivery/outbox'
import { errorCode } from '../db/errors'
import { writeIsolated } from '../db/isolated-write'
import { transactionKnown } from '../db/commit-outcome'
import type { Database, Tx } from '../db/client'
import type { NotedInvalidation } from './invalidate'
import type { Mailbox } from './mailbox'

interface BindRequest {
  licenseKey: string
  hwid: string
  /** Set once the transaction that held this request committed. */
  bound?: boolean
  resolve: (bound: boolean) => void
  reject: (err: unknown) => void
}

/** What the binder needs of the app's actor. */
export interface SeatOwner {
  readonly id: string
  readonly mailbox: Mailbox
  note(tx: Tx, changed: { licenses: readonly string[] }): Promise<NotedInvalidation | null>
  publish(changed: { licenses: readonly string[]; events: boolean }, noted: readonly NotedInvalidation[]): Promise<void>
}

const byKey = (a: BindRequest, b: BindRequest) => (a.licenseKey < b.licenseKey ? -1 : a.licenseKey > b.licenseKey ? 1 : 0)

/**
 * Binds new HWIDs to the seats of one app's licenses. Requests queue up while the app's mailbox is
 * busy and each batch is written in one transaction: one commit for a burst of first logins instead
 * of one per login. Each seat is still one conditional UPDATE, atomic in SQL, and that (not the
 * mailbox) is why processes sharing the database never bind more HWIDs than a license has seats;
 * rows are updated in key order so two processes' batches cannot deadlock. A request whose values
 * PostgreSQL refuses is split off (writeIsolated) and fails alone with bad_request; while the
 * database is unreachable the requests left fail with system_error, and no transaction was half
 * applied. A batch whose COMMIT's answer was lost is answered as PostgreSQL says it ended
 * (transactionKnown): a device bound must not be told its login failed, and its charge refunded.
 */
export class SeatBinder {
  #queue: BindRequest[] = []

  constructor(
    private readonly actor: SeatOwner,
    private readonly database: Database,
    private readonly clock: () => number,
  ) {}

  /** Requests waiting for the next batch. */
  get pending(): number {
    return this.#queue.length
  }

  /** True when this call bound the HWID; false when the conditions did not hold (the caller finds out why). */
  bind(licenseKey: string, hwid: string): Promise<boolean> {
    return new Promise((resolve, reject) => {
      if (this.#queue.push({ licenseKey, hwid, resolve, reject }) === 1) void this.actor.mailbox.run(this.#flush)
    })
  }

  readonly #flush = async (): Promise<void> => {
    const batch = this.#queue
    this.#queue = []
    batch.sort(byKey)
    const appId = this.actor.id
    const now = new Date(this.clock())
    const noted: NotedInvalidation[] = []
    const { refused, unwritten, outage } = await writeIsolated(batch, (part) => this.#bindAll(part, now, noted), 'isolate')
    if (refused.length > 0) {
      const [first] = refused
      log.warn('seat binding refused requests', { appId, requests: refused.length, code: errorCode(first?.error) })
      for (const { member, failure } of refused) member.reject(new PublicError(failure === 'data' ? 'bad_request' : 'system_error'))
    }
    if (unwritten.length > 0) {
      log.warn('database unavailable: seat binding failed', { appId, requests: unwritten.length, code: errorCode(outage) })
      for (const request of unwritten) request.reject(new PublicError('system_error'))
    }
    const committed = batch.filter((request) => request.bound !== undefined)
    const changed = [...new Set(committed.filter((request) => request.bound).map((request) => request.licenseKey))]
    // Until the bump lands, other processes still see the seat as free; their conditional UPDATE finds it taken.
    if (changed.length > 0) await this.actor.publish({ licenses: changed, events: true }, noted)
    for (const request of committed) request.resolve(request.bound === true)
  }

  /**
   * One transaction over `part`; each request's outcome is set only after it committed, and the
   * transaction's record of the licenses it bound (AppActor.note) joins `noted` then.
   */
  async #bindAll(part: readonly BindRequest[], now: Date, noted: NotedInvalidation[]): Promise<void> {
    const appId = this.actor.id
    const { bound: results, note } = await transactionKnown(this.database, async (tx) => {
      const bound: boolean[] = []
      const events: DomainEvent[] = []
      for (const { licenseKey, hwid } of part) {
        const rows = await tx
          .update(licenses)
          .set({ hwids: sql`array_append(${licenses.hwids}, ${hwid}::text)` })
          .where(
            and(
              eq(licenses.key, licenseKey),
              eq(licenses.appId, appId),
              eq(licenses.status, 'active'),
              sql`(${licenses.expiresAt} IS NULL OR ${licenses.expiresAt} > ${now.toISOString()}::timestamptz)`,
              sql`NOT (${hwid}::text = ANY(${licenses.hwids}))`,
              sql`cardinality(${licenses.hwids}) < ${licenses.maxHwidSlots}`,
            ),
          )
          .returning({ key: licenses.key })
        bound.push(rows.length > 0)
        if (rows.length > 0) events.push({ event: 'license.hwid_bound', data: { licenseKey, appId, hwid }, occurredAt: now })
      }
      await recordEvents(tx, events)
      const boundKeys = new Set(part.filter((_, i) => bound[i]).map((request) => request.licenseKey))
      return { bound, note: await this.actor.note(tx, { licenses: [...boundKeys] }) }
    })
    if (note) noted.push(note)
    part.forEach((request, i) => {
      request.bound = results[i] ?? false
    })
  }
}
