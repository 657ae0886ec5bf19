import { SignedPayloads } from './signing/payloads'
import { SessionTokens } from './signing/session'
import { ValidatedEventBatch } from './delivery/validated-events'
import type { Config } from './config'
import { deriveKey, Sealer } from './lib/crypto'
import { EventBus } from './delivery/outbox'
import { BoundedMap, MissBudget } from './actors/bounded'
import { ACTOR_LIMITS, AppActors } from './actors/registry'
import { KNOWN_API_KEYS, UNKNOWN_API_KEYS_PER_MINUTE } from './http/auth'
import { requireKeySource, resolveMasterKey } from './signing/master-key'
import { adoptKeyCheck, databaseSeal } from './signing/key-check'
import { COMMAND_SHARED_BUFFERS_MB, type Database, openDb, poolSizePerProcess } from './db/client'
import { Metrics } from './lib/metrics'
import { Signer } from './signing/signer'
import type { Context } from './context'
import { openStore } from './store/redis'
import type { Store } from './store/store'
import { DeliveryPool } from './delivery/pool'
import { CreditLedger } from './credits/ledger'
import { InFlightLimit } from './lib/in-flight'
import { TEST_PINGS_PER_ACCOUNT } from './webhooks/service'
import { PING_FETCHES } from './delivery/fetch-limit'

/** What a test, a bench or the CLI brings of its own instead of what the server would open. */
export interface ContextOverrides {
  database?: Database
  store?: Store
  /** Instead of MASTER_KEY or the development key in DATA_DIR. */
  masterKey?: Buffer
  clock?: () => number
  /** One signer (one signing thread) shared by many contexts of one process, as a test's are. */
  signer?: Signer
  /**
   * The server runs inside another program (a test) rather than as its own process: deliveries keep
   * normal CPU priority, so they do not slow the program's own requests, and trust the CA of the
   * settings' NODE_EXTRA_CA_CERTS, which this process did not start with.
   */
  embedded?: boolean
  /** A one-off command's context (the operator CLI's): its embedded database starts with COMMAND_SHARED_BUFFERS_MB. */
  command?: boolean
}

/** Opens storage (applying migrations) and builds the dependencies the server, the CLI and the tests share. */
export async function buildContext(config: Readonly<Config>, overrides: ContextOverrides = {}): Promise<Context> {
  if (!overrides.masterKey) requireKeySource(config)
  // Redis first: a database number or credentials it refuses are a setting, refused before an embedded
  // database is created or a development key generated for a start that cannot run.
  const store = overrides.store ?? (await openStore(config.redisUrl, config.redisClusterShards))
  try {
    return await withStorage(config, overrides, store)
  } catch (err) {
    if (!overrides.store) await store.close()
    throw err
  }
}

async function withStorage(config: Readonly<Config>, overrides: ContextOverrides, store: Store): Promise<Context> {
  const database =
    overrides.database ??
    (await openDb({
      databaseUrl: config.databaseUrl,
      dataDir: config.dataDir,
      poolSize: poolSizePerProcess(config.serverProcesses),
      sharedBuffersMb: overrides.command ? COMMAND_SHARED_BUFFERS_MB : undefined,
    }))
  let masterKey: Buffer
  let sealer: Sealer
  try {
    // The database says which key its secrets are sealed with: a development-key rotation cut short
    // after its commit is finished here, and a wrong key stops the start.
    masterKey = overrides.masterKey ?? resolveMasterKey(config, await databaseSeal(database.db))
    sealer = new Sealer(masterKey)
    await adoptKeyCheck(database, sealer)
  } catch (err) {
    if (!overrides.database) await database.close()
    throw err
  }
  const embedded = overrides.embedded ?? false
  return assembleContext({
    config,
    database,
    store,
    sealer,
    sessionKey: deriveKey(masterKey, 'session-token-v1'),
    bus: new EventBus(),
    webhookPool: new DeliveryPool({
      allowPrivate: config.webhookAllowPrivateTargets,
      // Bun itself trusts NODE_EXTRA_CA_CERTS read at process start; passing it again per request
      // would cost a TLS context (and a connection) per delivery.
      extraCaFile: embedded ? config.webhookExtraCaFile : null,
      lowPriority: !embedded,
    }),
    signer: overrides.signer ?? new Signer(),
    metrics: new Metrics(),
    clock: overrides.clock ?? Date.now,
  })
}

/** What boot opens or chooses; the rest of the context is built from it. */
type ContextBase = Omit<Context, 'actors' | 'credits' | 'sessions' | 'payloads' | 'validatedEvents' | 'unknownApiKeys' | 'knownApiKeys' | 'testPings' | 'pingFetches'>

function assembleContext(base: ContextBase): Context {
  return {
    ...base,
    actors: new AppActors(base, { ...ACTOR_LIMITS, cacheBytes: base.config.cacheMaxMb * 2 ** 20 }),
    credits: new CreditLedger(base),
    sessions: new SessionTokens(base.sessionKey),
    payloads: new SignedPayloads(base.signer),
    validatedEvents: new ValidatedEventBatch({ database: base.database, bus: base.bus, dropped: base.metrics.validatedEventsDropped }),
    unknownApiKeys: new MissBudget(UNKNOWN_API_KEYS_PER_MINUTE, ACTOR_LIMITS.absent),
    knownApiKeys: new BoundedMap(KNOWN_API_KEYS),
    testPings: new InFlightLimit(TEST_PINGS_PER_ACCOUNT),
    pingFetches: new InFlightLimit(PING_FETCHES),
  }
}
