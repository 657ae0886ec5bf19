import { SignedPayloads } from './client-auth/payload'
import { SessionTokens } from './client-auth/session'
import { EventBatch } from './client-auth/validated-events'
import type { Config } from './config'
import { deriveKey, Sealer } from './lib/crypto'
import { EventBus } from './delivery/outbox'
import { AppActors } from './actors/registry'
import { resolveMasterKey } from './signing/master-key'
import { openDb } from './db/client'
import { HttpMetrics } from './http/metrics'
import { serverProcessIndex } from './server-processes'
import { Signer } from './signing/signer'
import type { Context } from './context'
import { openStore } from './store/redis'
import { DeliveryPool } from './delivery/pool'

/** Opens storage (applying migrations) and builds the dependencies the server and the CLI share. */
export async function buildContext(config: Readonly<Config>): Promise<Context> {
  const masterKey = resolveMasterKey(config.masterKey, config.dataDir)
  const database = await openDb({ databaseUrl: config.databaseUrl, dataDir: config.dataDir })
  const store = await openStore(config.redisUrl)
  return assembleContext({
    config,
    database,
    store,
    sealer: new Sealer(masterKey),
    sessionKey: deriveKey(masterKey, 'session-token-v1'),
    bus: new EventBus(),
    webhookPool: new DeliveryPool({
      allowPrivate: config.webhookAllowPrivateTargets,
      // Bun itself trusts NODE_EXTRA_CA_CERTS read at process start; passing it again per request
      // would cost a TLS context (and a connection) per delivery.
      extraCaFile: null,
      lowPriority: true,
    }),
    signer: new Signer(),
    metrics: new HttpMetrics(config.serverProcesses > 1 ? serverProcessIndex() : null),
    clock: Date.now,
  })
}

/** What boot opens or chooses; everything else in the context is built from it. */
export type ContextBase = Omit<Context, 'actors' | 'clientAuth'>

/** Builds the actors and the client endpoints' state over `base`: the server and the tests both come through here. */
export function assembleContext(base: ContextBase): Context {
  return {
    ...base,
    actors: new AppActors(base),
    clientAuth: {
      events: new EventBatch({ database: base.database, bus: base.bus, dropped: base.metrics.validatedEventsDropped }),
      payloads: new SignedPayloads(base.signer),
      sessions: new SessionTokens(base.sessionKey),
    },
  }
}
