import type { Config } from './config'
import { deriveKey, Sealer } from './core/crypto'
import { EventBus } from './core/events'
import { Mailbox } from './core/mailbox'
import { resolveMasterKey } from './core/master-key'
import { openDb } from './db/client'
import type { Deps } from './deps'
import { openStore } from './store/redis'
import { DeliveryPool } from './webhooks/pool'

/** Opens storage (applying migrations) and builds the dependencies the server and the CLI share. */
export async function buildDeps(config: Readonly<Config>): Promise<Deps> {
  const masterKey = resolveMasterKey(config.masterKey, config.dataDir)
  const database = await openDb({ databaseUrl: config.databaseUrl, dataDir: config.dataDir })
  const store = await openStore(config.redisUrl)
  return {
    config,
    database,
    store,
    sealer: new Sealer(masterKey),
    sessionKey: deriveKey(masterKey, 'session-token-v1'),
    mailbox: new Mailbox(),
    bus: new EventBus(),
    webhookPool: new DeliveryPool({
      allowPrivate: config.webhookAllowPrivateTargets,
      // Bun itself trusts NODE_EXTRA_CA_CERTS read at process start; passing it again per request
      // would cost a TLS context (and a connection) per delivery.
      extraCaFile: null,
      lowPriority: true,
    }),
    clock: Date.now,
  }
}
