import type { Config } from './config'
import type { Sealer } from './lib/crypto'
import type { EventBus } from './delivery/outbox'
import type { ValidatedEventBatch } from './delivery/validated-events'
import type { AppActors } from './actors/registry'
import type { Database } from './db/client'
import type { Metrics } from './lib/metrics'
import type { SignedPayloads } from './signing/payloads'
import type { SessionTokens } from './signing/session'
import type { Signer } from './signing/signer'
import type { Store } from './store/store'
import type { DeliveryPool } from './delivery/pool'
import type { CreditLedger } from './credits/ledger'
import type { BoundedMap, MissBudget } from './actors/bounded'
import type { InFlightLimit } from './lib/in-flight'

/** Infrastructure handed to every route module and use-case; built once by boot.ts's buildContext, for the server, the CLI and the tests alike. */
export interface Context {
  config: Readonly<Config>
  database: Database
  store: Store
  /** Seals signing keys and webhook secrets at rest. */
  sealer: Sealer
  /** Derived from the master key: MACs session tokens (through `sessions`) and license list cursors. */
  sessionKey: Buffer
  /** One actor per app: the app's live state in this process and the one way its data changes. */
  actors: AppActors
  bus: EventBus
  /** Worker threads that send webhook deliveries (started lazily, closed at shutdown). */
  webhookPool: DeliveryPool
  /** Ed25519 signatures, on a worker thread when the server runs one process, else on the calling thread. */
  signer: Signer
  /** Prometheus counters of this process, served at /metrics. */
  metrics: Metrics
  /** Issues and reads the stateless session tokens of the client endpoints. */
  sessions: SessionTokens
  /** Writes and signs the payload of a successful validate or heartbeat. */
  payloads: SignedPayloads
  /** license.validated events waiting for their batched INSERT; main.ts stops it at shutdown. */
  validatedEvents: ValidatedEventBatch
  /** Live and reconciled credit balances; main.ts starts its reconciler. */
  credits: CreditLedger
  /** Per IP, Developer API key lookups that found no key (http/auth.ts). */
  unknownApiKeys: MissBudget
  /** Hashes of Developer API keys last found live or revoked, which skip unknownApiKeys (http/auth.ts). */
  knownApiKeys: BoundedMap<'live' | 'revoked'>
  /** Test pings on their way, by account (webhooks/service.ts). */
  testPings: InFlightLimit
  /** The test pings on their way in this process, all accounts' (fetch-limit.ts). */
  pingFetches: InFlightLimit
  /** Milliseconds since the epoch; tests inject their own. */
  clock: () => number
}
