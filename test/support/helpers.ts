import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createApp } from '../../src/app'
import type { BODY_DEADLINES } from '../../src/http/body-limits'
import { buildContext } from '../../src/boot'
import { Signer } from '../../src/signing/signer'
import { loadConfig, type Config } from '../../src/config'
import { createAccount } from '../../src/accounts/service'
import { createApplication } from '../../src/apps/service'
import { openDb, type Database } from '../../src/db/client'
import { setLogLevel } from '../../src/lib/log'
import { MemoryStore } from '../../src/store/memory'
import { RedisStore } from '../../src/store/redis'
import type { Store } from '../../src/store/store'

/** Which backend this run tests: real PostgreSQL + Redis, or the embedded twins. */
export const MODE: 'postgres' | 'embedded' = process.env.TEST_DATABASE_URL ? 'postgres' : 'embedded'
export const TEST_DATABASE_URL = process.env.TEST_DATABASE_URL ?? null
export const TEST_REDIS_URL = process.env.TEST_REDIS_URL ?? null

setLogLevel('error')

let shared: Promise<{ database: Database; store: Store }> | undefined

/** One database and store per test process (files share them and create their own accounts). */
export function sharedInfra(): Promise<{ database: Database; store: Store }> {
  shared ??= (async () => {
    const database = await openDb({ databaseUrl: TEST_DATABASE_URL, dataDir: null })
    const store: Store = TEST_REDIS_URL ? new RedisStore(TEST_REDIS_URL) : new MemoryStore()
    return { database, store }
  })()
  return shared
}

export const TEST_MASTER_KEY = Buffer.alloc(32, 7)
/** Every test context of a process signs on one worker thread, as the server's contexts would. */
const signer = new Signer()

export interface TestAppOptions {
  clock?: () => number
  env?: Record<string, string>
  /** A store of the test's own instead of the shared one. */
  store?: Store
  /** A database of the test's own (a fault test's cluster) instead of the shared one. */
  database?: Database
  /** Shorter waits for a whole body than the server's, for the tests of them. */
  bodyDeadlines?: typeof BODY_DEADLINES
}

export async function makeTestApp(options: TestAppOptions = {}) {
  const infra = await sharedInfra()
  const config: Readonly<Config> = loadConfig({
    DATA_DIR: mkdtempSync(join(tmpdir(), 'ls-test-')),
    WEBHOOK_ALLOW_PRIVATE_TARGETS: 'true',
    ...options.env,
  })
  const ctx = await buildContext(config, {
    database: options.database ?? infra.database,
    store: options.store ?? infra.store,
    masterKey: TEST_MASTER_KEY,
    signer,
    clock: options.clock,
    embedded: true,
  })
  const app = createApp(ctx, undefined, options.bodyDeadlines)

  interface Res<T = any> {
    status: number
    body: T
    headers: Headers
  }

  /** Calls the app in-process. `body` is sent as JSON unless it is already a string. */
  async function req<T = any>(
    method: string,
    path: string,
    init: { body?: unknown; apiKey?: string; headers?: Record<string, string> } = {},
  ): Promise<Res<T>> {
    const headers: Record<string, string> = { ...init.headers }
    if (init.apiKey) headers.authorization = `Bearer ${init.apiKey}`
    let body: string | undefined
    if (init.body !== undefined) {
      headers['content-type'] ??= 'application/json'
      body = typeof init.body === 'string' ? init.body : JSON.stringify(init.body)
    }
    const res = await app.handle(new Request(`http://localhost${path}`, { method, headers, body }))
    const text = await res.text()
    let parsed: unknown = text
    try {
      parsed = JSON.parse(text)
    } catch {}
    return { status: res.status, body: parsed as T, headers: res.headers }
  }

  /** A fresh account with credits, an API key and one app. */
  async function seed(opts: { credits?: number; sandbox?: boolean; name?: string } = {}) {
    const account = await createAccount(ctx, opts.name ?? 'Test account', opts.credits ?? 1000)
    const created = await createApplication(ctx, account.accountId, 'Test app', opts.sandbox ?? false)
    return { ...account, ...created }
  }

  return { app, ctx, req, seed }
}

export type TestApp = Awaited<ReturnType<typeof makeTestApp>>
