import type { Config } from './config'
import type { Sealer } from './core/crypto'
import type { EventBus } from './core/events'
import type { Mailbox } from './core/mailbox'
import type { Database } from './db/client'
import type { Store } from './store/store'
import type { DeliveryPool } from './webhooks/pool'

/** Infrastructure handed to every route module and use-case; built once by index.ts or a test. */
export interface Deps {
  config: Readonly<Config>
  database: Database
  store: Store
  /** Seals signing keys and webhook secrets at rest. */
  sealer: Sealer
  /** Derived from the master key: MACs stateless session tokens. */
  sessionKey: Buffer
  mailbox: Mailbox
  bus: EventBus
  /** Worker threads that send webhook deliveries (started lazily, closed at shutdown). */
  webhookPool: DeliveryPool
  /** Milliseconds since the epoch; tests inject their own. */
  clock: () => number
}
