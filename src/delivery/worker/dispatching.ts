import { type Db, poolOptions } from '../../db/client'
import { errorFields, log, setLogLevel } from '../../lib/log'
import type { RunningDispatcher } from '../dispatch/options'
import type { DispatchStart, SecretReply, SecretRequest, WorkerEvent } from '../protocol'
import type { Deliveries } from './deliveries'

interface Started {
  running: RunningDispatcher
  close: () => Promise<void>
}

/**
 * The outbox dispatcher when this worker runs it (PostgreSQL): on a connection of its own, woken by
 * the main thread after commits, asking the main thread for webhook secrets (the master key stays
 * there), sending through this worker's own queue.
 */
export class Dispatching {
  readonly #deliveries: Deliveries
  readonly #post: (msg: WorkerEvent) => void
  #started: Promise<Started> | null = null
  readonly #wakeUps = new Set<() => void>()
  readonly #secretWaits = new Map<string, ((secret: string | null) => void)[]>()

  constructor(deliveries: Deliveries, post: (msg: WorkerEvent) => void) {
    this.#deliveries = deliveries
    this.#post = post
  }

  start(msg: DispatchStart): void {
    this.#started ??= this.#start(msg)
  }

  /** Stops the dispatcher (when it runs) and closes its connection, then tells the main thread. */
  stop(): void {
    const stopping = this.#started
    this.#started = null
    void (async () => {
      try {
        if (stopping) {
          const { running, close } = await stopping
          await running.stop()
          await close()
        }
      } catch (err) {
        log.error('webhook dispatcher did not stop cleanly', errorFields(err))
      } finally {
        this.#post({ type: 'stopped' })
      }
    })()
  }

  /** A commit on the main thread wrote events. */
  wake(): void {
    for (const wake of this.#wakeUps) wake()
  }

  opened(msg: SecretReply): void {
    for (const done of this.#secretWaits.get(msg.sealed) ?? []) done(msg.secret)
    this.#secretWaits.delete(msg.sealed)
  }

  async #start(msg: DispatchStart): Promise<Started> {
    setLogLevel(msg.logLevel)
    const { default: postgres } = await import('postgres')
    const { drizzle } = await import('drizzle-orm/postgres-js')
    const { WebhookDispatcher } = await import('../dispatch/webhook-dispatcher')
    // Claims, records and the poll's fan-out run one at a time; two connections let a purge overlap.
    const client = postgres(msg.databaseUrl, { ...poolOptions(postgres, msg.databaseUrl), max: 2 })
    const deliveries = this.#deliveries
    const running = new WebhookDispatcher(
      {
        db: drizzle({ client }) as unknown as Db,
        send: (job) => deliveries.send(job),
        cancelQueued: (withdrawn) => deliveries.cancelQueued(withdrawn),
        openSecret: (sealed) => this.#openSecret(sealed),
        onCommit: (listener) => {
          this.#wakeUps.add(listener)
          return () => this.#wakeUps.delete(listener)
        },
        recorded: (outcomes) => this.#post({ type: 'recorded', outcomes }),
        clock: Date.now,
      },
      msg.options,
    ).start()
    return { running, close: () => client.end({ timeout: 5 }) }
  }

  #openSecret(sealed: string): Promise<string> {
    return new Promise((resolve, reject) => {
      const waits = this.#secretWaits.get(sealed)
      const done = (secret: string | null) =>
        secret === null ? reject(new Error('webhook secret could not be opened')) : resolve(secret)
      if (waits) return void waits.push(done)
      this.#secretWaits.set(sealed, [done])
      const request: SecretRequest = { type: 'open', sealed }
      this.#post(request)
    })
  }
}
