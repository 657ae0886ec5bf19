import { SERVER_CONNECTION_NAME } from '../config'
import { makeDataDir } from './data-dir'
import { join } from 'node:path'
import { sql } from 'drizzle-orm'
import type { PgDatabase, PgQueryResultHKT, PgTransaction } from 'drizzle-orm/pg-core'
import type { ExtractTablesWithRelations } from 'drizzle-orm'
import type postgres from 'postgres'
import * as schema from './schema'
import { STALL_SECONDS, backendCheck } from './stall-check'

export type Schema = typeof schema
/** Either driver's database: postgres.js against a server, or embedded PGlite. */
export type Db = PgDatabase<PgQueryResultHKT, Schema>
export type Tx = PgTransaction<PgQueryResultHKT, Schema, ExtractTablesWithRelations<Schema>>
/** Query helpers take either, so they compose inside a caller's transaction. */
export type DbOrTx = Db | Tx

/** One statement, with its parameters as $1, $2…, asked on a connection `Database.aside` holds. */
export type Ask = (text: string, params: unknown[]) => Promise<Record<string, unknown>[]>

export interface Database {
  db: Db
  kind: 'postgres' | 'pglite'
  /** The postgres:// URL (other threads open connections of their own); null for PGlite. */
  url: string | null
  /**
   * Runs `questions` on a connection of their own, outside the request pool, closed after: asked
   * through the pool, their answers would wait behind every request queued for it. PGlite has one
   * connection, which they share.
   */
  aside<T>(questions: (ask: Ask) => Promise<T>): Promise<T>
  ping(): Promise<boolean>
  close(): Promise<void>
}

const migrationsFolder = join(import.meta.dir, '..', '..', 'drizzle')

export interface OpenDbOptions {
  /** postgres://… or null for PGlite. */
  databaseUrl: string | null
  /** PGlite directory; null keeps the embedded database in memory (tests). */
  dataDir: string | null
  /** Connections of the request pool (postgres://… only); REQUEST_POOL_SIZE unless given. */
  poolSize?: number
  /** Seconds a query goes unanswered before its connection is checked on; STALL_SECONDS unless given. */
  stallSeconds?: number
  /** PGlite's shared buffers in MB (a dataDir only); PGlite's 128 unless given. */
  sharedBuffersMb?: number
}

/**
 * The shared buffers of a one-off command's embedded database (the operator CLI's). PGlite touches
 * every page of them at each start: at its 128 MB that was half of a command's time and memory
 * (~0.5 s of CPU, 120 MB), for a command that reads and writes a few pages.
 */
export const COMMAND_SHARED_BUFFERS_MB = 16

/**
 * How long the service waits for a lock another session holds (lock_timeout): past it the statement
 * fails with 55P03 instead of holding up whatever waits behind it (commit-outcome.ts TRANSACTION_LOCK_WAIT).
 */
export const LOCK_WAIT = '2s'

/**
 * The settings of the transaction `Database.aside` asks in: the transaction's own (set_config's `true`),
 * as a session's setting outlives the client behind a pooler in transaction mode (PgBouncer): the server
 * connection it stayed on gave every client after it a 5 s statement timeout.
 */
const ASIDE_LIMITS = `SELECT set_config('statement_timeout', '5s', true), set_config('lock_timeout', '${LOCK_WAIT}', true)`

/** The request pool of a server: shared out among its processes, so the server holds about as many. */
export const REQUEST_POOL_SIZE = 16
/** A process's share still runs a few queries at once (the mailboxes of several apps, the API). */
const MIN_POOL_SHARE = 4

/**
 * Each process's request pool when `serverProcesses` share the port: one per core is the default,
 * and sixteen connections on each of many cores would pass PostgreSQL's default max_connections
 * (100). The warm client endpoints run no query at all, so the share costs them nothing.
 */
export const poolSizePerProcess = (serverProcesses: number) =>
  Math.max(MIN_POOL_SHARE, Math.ceil(REQUEST_POOL_SIZE / serverProcesses))

/** Session lock a starting process holds while it migrates; held by whatever must not overlap a start. */
export const MIGRATION_LOCK = 7428531

/**
 * postgres.js settings of every pool that serves requests or deliveries. Its default back-off grows
 * with every failed connect, shared by the pool, to 10-20 s: after an outage each query then waits
 * that long before its connection even tries (the per-app mailbox, the webhook dispatcher behind it
 * stall). A refused connect is cheap, so retry within a second at most.
 */
const CONNECTION_OPTIONS = {
  onnotice: () => {},
  connection: {
    // How `master-key rotate` sees, in pg_stat_activity, a server still connected that holds the old key.
    application_name: SERVER_CONNECTION_NAME,
    // Nothing else: a pooler (PgBouncer) refuses a startup parameter it does not know, and with it
    // every connection. idle_in_transaction_session_timeout is the database's setting (README).
  },
  backoff: (retries: number) => Math.min(0.05 * 2 ** retries, 1),
  // A connect that gets no answer (a server going down or coming up) otherwise holds its query 30 s.
  connect_timeout: 5,
} satisfies postgres.Options<{}>

/**
 * The settings of a pool of `url`: those above, and the check on a connection whose query goes
 * unanswered for `stallSeconds` (stall-check.ts).
 */
export function poolOptions(connect: typeof postgres, url: string, stallSeconds = STALL_SECONDS): postgres.Options<{}> {
  return { ...CONNECTION_OPTIONS, stall_timeout: stallSeconds, stall_check: backendCheck(connect, url, CONNECTION_OPTIONS, stallSeconds) }
}

/** Where the embedded database keeps its files in DATA_DIR. */
export const pgliteDir = (dataDir: string) => join(dataDir, 'pglite')

/** Opens the database and applies pending migrations before anything uses it. */
export async function openDb(options: OpenDbOptions): Promise<Database> {
  if (options.databaseUrl) {
    const { default: postgres } = await import('postgres')
    const { drizzle } = await import('drizzle-orm/postgres-js')
    const client = postgres(options.databaseUrl, {
      ...poolOptions(postgres, options.databaseUrl, options.stallSeconds),
      max: options.poolSize ?? REQUEST_POOL_SIZE,
    })
    const db = drizzle({ client, schema })
    const lockConn = postgres(options.databaseUrl, { max: 1, onnotice: () => {} })
    try {
      await migrateUnderLock(lockConn)
    } finally {
      await lockConn.end({ timeout: 5 })
    }
    return {
      db: db as unknown as Db,
      kind: 'postgres',
      url: options.databaseUrl,
      aside: async (questions) => {
        const side = postgres(options.databaseUrl!, { ...CONNECTION_OPTIONS, max: 1 })
        try {
          return await side.begin(async (tx) => {
            // Bounded, as a question must be: behind a lock another session holds, or a statement that
            // does not end, it fails instead (a connect gets connect_timeout).
            await tx.unsafe(ASIDE_LIMITS)
            return questions(async (text, params) => [...(await tx.unsafe(text, params as postgres.ParameterOrJSON<never>[]))])
          }) as Awaited<ReturnType<typeof questions>>
        } finally {
          side.end({ timeout: 0 }).catch(() => {})
        }
      },
      ping: () => pingWith(db as unknown as Db),
      close: () => client.end({ timeout: 5 }),
    }
  }
  const { PGlite } = await import('@electric-sql/pglite')
  const { openDurablePglite } = await import('./durable-pglite')
  const { drizzle } = await import('drizzle-orm/pglite')
  const { migrate } = await import('drizzle-orm/pglite/migrator')
  if (options.dataDir) makeDataDir(options.dataDir)
  const client = options.dataDir ? openDurablePglite(pgliteDir(options.dataDir), options.sharedBuffersMb) : new PGlite()
  const db = drizzle({ client, schema })
  await migrate(db, { migrationsFolder })
  return {
    db: db as unknown as Db,
    kind: 'pglite',
    url: null,
    aside: (questions) => questions(async (text, params) => (await client.query<Record<string, unknown>>(text, params)).rows),
    ping: () => pingWith(db as unknown as Db),
    close: () => client.close(),
  }
}

/**
 * Applies the pending migrations in one transaction that first takes MIGRATION_LOCK: of processes
 * starting at once one migrates and the others wait, then find nothing left to do. The transaction's
 * lock, not a session's: behind a pooler in transaction mode (PgBouncer) a session's lock stayed with
 * the server connection that took it, held after the process had gone, and each later start waited on
 * it for good. The record of what ran is drizzle-kit's, kept as its migrator keeps it.
 */
async function migrateUnderLock(connection: postgres.Sql): Promise<void> {
  const { readMigrationFiles } = await import('drizzle-orm/migrator')
  const migrations = readMigrationFiles({ migrationsFolder })
  await connection.begin(async (tx) => {
    await tx.unsafe(`SELECT pg_advisory_xact_lock(${MIGRATION_LOCK})`)
    await tx.unsafe('CREATE SCHEMA IF NOT EXISTS drizzle')
    await tx.unsafe('CREATE TABLE IF NOT EXISTS drizzle.__drizzle_migrations (id SERIAL PRIMARY KEY, hash text NOT NULL, created_at bigint)')
    const [last] = await tx.unsafe('SELECT created_at FROM drizzle.__drizzle_migrations ORDER BY created_at DESC LIMIT 1')
    for (const migration of migrations) {
      if (last && Number(last.created_at) >= migration.folderMillis) continue
      for (const statement of migration.sql) await tx.unsafe(statement)
      await tx.unsafe('INSERT INTO drizzle.__drizzle_migrations (hash, created_at) VALUES ($1, $2)', [migration.hash, migration.folderMillis])
    }
  })
}

async function pingWith(db: Db): Promise<boolean> {
  try {
    await db.execute(sql`SELECT 1`)
    return true
  } catch {
    return false
  }
}
