import type { Db } from '../db/client'
import { WebhookDispatcher } from './dispatch/webhook-dispatcher'
import type { DispatcherOptions, RunningDispatcher } from './dispatch/options'
import type { DeliveryPool, DispatchHost } from './pool'

/** What starting the dispatcher takes from the server's context (a Context fits). */
export interface DispatcherWiring extends DispatchHost {
  database: { db: Db; url: string | null }
  webhookPool: DeliveryPool
  clock: () => number
}

/**
 * Starts delivering the outbox; stop() before closing the database. On PostgreSQL the dispatcher
 * runs in one of the pool's workers (with the pool's delivery settings); on PGlite on this thread,
 * sending through the pool.
 */
export function startDispatcher(ctx: DispatcherWiring, options: DispatcherOptions = {}): RunningDispatcher {
  const url = ctx.database.url
  const pool = ctx.webhookPool
  if (url) return pool.dispatch(url, options, ctx)
  pool.start()
  return new WebhookDispatcher(
    {
      db: ctx.database.db,
      send: (job) => pool.send(job),
      cancelQueued: (withdrawn) => pool.cancelQueued(withdrawn),
      openSecret: async (sealed) => ctx.sealer.open(sealed).toString('utf8'),
      onCommit: (listener) => ctx.bus.subscribe(listener),
      recorded: (outcomes) => ctx.metrics.webhookDeliveries.addAll(outcomes),
      clock: ctx.clock,
    },
    options,
  ).start()
}
