import { and, eq, sql } from 'drizzle-orm'
import { licenses } from '../db/schema'
import type { Context } from '../context'
import { PublicError } from '../lib/errors'
import { log } from '../lib/log'
import { keys } from '../store/store'
import { type DomainEvent, recordEvents } from '../delivery/outbox'
import { invalidate } from './invalidate'
import { errorCode, writeIsolated } from '../db/isolated-write'

interface BindRequest {
  licenseKey: string
  hwid: string
  /** Set once the transaction that held this request committed. */
  bound?: boolean
  resolve: (bound: boolean) => void
  reject: (err: unknown) => void
}

/**
 * Binds new HWIDs to license seats. Requests of one app queue up and the app's mailbox writes each
 * batch in one transaction: one commit for a burst of first logins instead of one per login. Each
 * seat is still one conditional UPDATE, atomic in SQL, so instances sharing the database never bind
 * more HWIDs than a license has seats; rows are updated in key order so two instances' batches
 * cannot deadlock. A request whose values PostgreSQL refuses is split off (writeIsolated) and fails
 * alone with bad_request; while the database is unreachable the requests left fail with
 * system_error, and no transaction was half applied.
 */
export class SeatBinder {
  readonly #queues = new Map<string, BindRequest[]>()

  constructor(private readonly ctx: Context) {}

  /** True when this call bound the HWID; false when the conditions did not hold (the caller finds out why). */
  bind(appId: string, licenseKey: string, hwid: string): Promise<boolean> {
    return new Promise((resolve, reject) => {
      let queue = this.#queues.get(appId)
      if (!queue) {
        queue = []
        this.#queues.set(appId, queue)
        void this.ctx.mailbox.run(appId, () => this.#flush(appId))
      }
      queue.push({ licenseKey, hwid, resolve, reject })
    })
  }

  async #flush(appId: string): Promise<void> {
    const batch = this.#queues.get(appId) ?? []
    this.#queues.delete(appId)
    batch.sort((a, b) => (a.licenseKey < b.licenseKey ? -1 : a.licenseKey > b.licenseKey ? 1 : 0))
    const now = new Date(this.ctx.clock())
    const { refused, unwritten, outage } = await writeIsolated(batch, (part) => this.#bindAll(appId, part, now))
    if (refused.length > 0) {
      const [first] = refused
      log.warn('seat binding refused requests', { appId, requests: refused.length, code: errorCode(first?.error) })
      for (const { member, failure } of refused) member.reject(new PublicError(failure === 'data' ? 'bad_request' : 'system_error'))
    }
    if (unwritten.length > 0) {
      log.warn('database unreachable: seat binding failed', { appId, requests: unwritten.length, code: errorCode(outage) })
      for (const request of unwritten) request.reject(new PublicError('system_error'))
    }
    const committed = batch.filter((request) => request.bound !== undefined)
    const changed = [...new Set(committed.filter((request) => request.bound).map((request) => request.licenseKey))]
    if (changed.length > 0) {
      this.ctx.bus.notify()
      // Until it lands, other instances still see the seat as free; their conditional UPDATE finds it taken.
      await invalidate(this.ctx, changed.map(keys.licenseEpoch))
    }
    for (const request of committed) request.resolve(request.bound === true)
  }

  /** One transaction over `part`; each request's outcome is set only after it committed. */
  async #bindAll(appId: string, part: readonly BindRequest[], now: Date): Promise<void> {
    const results = await this.ctx.database.db.transaction(async (tx) => {
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
      return bound
    })
    part.forEach((request, i) => {
      request.bound = results[i] ?? false
    })
  }
}
