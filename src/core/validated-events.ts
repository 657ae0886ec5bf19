import type { Deps } from '../deps'
import { errorFields, log } from '../log'
import { type DomainEvent, recordEvents } from './events'

/**
 * How long a license.validated event waits in memory for others to join its INSERT. It fires on
 * every login, and per statement PostgreSQL pays a commit (WAL flush) and the statement's fixed
 * costs: at thousands of logins a second, one statement per 50 ms costs far less database CPU per
 * event than one per 5 ms. The price: a crash loses the events of the last ≤ 50 ms (no database
 * change caused them, so there is no transaction they could join).
 */
export const VALIDATED_BATCH_MS = 50

/**
 * license.validated fires on every login: written in batches (one INSERT per VALIDATED_BATCH_MS,
 * ordered through the mailbox) instead of one transaction per request.
 */
export class EventBatch {
  #queue: DomainEvent[] = []
  #timer: ReturnType<typeof setTimeout> | null = null
  constructor(private readonly deps: Deps) {}

  add(event: DomainEvent): void {
    this.#queue.push(event)
    this.#timer ??= setTimeout(() => void this.flush(), VALIDATED_BATCH_MS)
  }

  flush(): Promise<void> {
    if (this.#timer) clearTimeout(this.#timer)
    this.#timer = null
    const list = this.#queue
    this.#queue = []
    if (list.length === 0) return Promise.resolve()
    return this.deps.mailbox.run('events:validated', async () => {
      try {
        await recordEvents(this.deps.database.db, list)
        this.deps.bus.notify()
      } catch (err) {
        log.warn('could not record license.validated events', { count: list.length, ...errorFields(err) })
      }
    })
  }
}
