import type { Deps } from '../deps'
import { errorFields, log } from '../log'
import { type DomainEvent, recordEvents } from './events'

/**
 * license.validated fires on every login: written in batches (one INSERT every few milliseconds,
 * ordered through the mailbox) instead of one transaction per request.
 */
export class EventBatch {
  #queue: DomainEvent[] = []
  #timer: ReturnType<typeof setTimeout> | null = null
  constructor(private readonly deps: Deps) {}

  add(event: DomainEvent): void {
    this.#queue.push(event)
    this.#timer ??= setTimeout(() => void this.flush(), 5)
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
