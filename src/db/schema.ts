import { sql } from 'drizzle-orm'
import {
  bigint,
  bigserial,
  boolean,
  check,
  index,
  integer,
  jsonb,
  pgTable,
  primaryKey,
  smallint,
  text,
  timestamp,
  uniqueIndex,
  uuid,
} from 'drizzle-orm/pg-core'

/** A flat map of variables: string, number or boolean values only. */
export type VariableMap = Record<string, string | number | boolean>

/** The machines an offline license file verifies on. */
export type OfflineHwid = { mode: 'bound'; hwids: string[] } | { mode: 'any' }

const createdAt = () =>
  timestamp('created_at', { withTimezone: true, precision: 3, mode: 'date' }).notNull().defaultNow()

const textList = (name: string) =>
  text(name)
    .array()
    .notNull()
    .default(sql`'{}'::text[]`)

export const accounts = pgTable('accounts', {
  id: uuid('id').primaryKey().defaultRandom(),
  name: text('name').notNull(),
  /** Balance as last reconciled; the live balance also subtracts what the store has not flushed yet. */
  credits: bigint('credits', { mode: 'number' }).notNull().default(0),
  /**
   * The store's credit sequence number (keys.creditSeq) at the last change of `credits` (a flush, an
   * add): a store that holds a lower one came back from an older copy of its data (ledger.ts).
   */
  creditSeq: bigint('credit_seq', { mode: 'number' }).notNull().default(0),
  createdAt: createdAt(),
})

export const apiKeys = pgTable(
  'api_keys',
  {
    id: uuid('id').primaryKey().defaultRandom(),
    accountId: uuid('account_id')
      .notNull()
      .references(() => accounts.id, { onDelete: 'cascade' }),
    /** SHA-256 hex of the whole key; the key itself is never stored. */
    keyHash: text('key_hash').notNull(),
    createdAt: createdAt(),
    revokedAt: timestamp('revoked_at', { withTimezone: true, precision: 3, mode: 'date' }),
  },
  (t) => [uniqueIndex('api_keys_key_hash_idx').on(t.keyHash)],
)

export const apps = pgTable(
  'apps',
  {
    id: uuid('id').primaryKey().defaultRandom(),
    accountId: uuid('account_id')
      .notNull()
      .references(() => accounts.id, { onDelete: 'cascade' }),
    name: text('name').notNull(),
    sandbox: boolean('sandbox').notNull().default(false),
    /** SHA-256 hex of the app secret. */
    secretHash: text('secret_hash').notNull(),
    disabled: boolean('disabled').notNull().default(false),
    variables: jsonb('variables').$type<VariableMap>().notNull().default({}),
    hwidBlacklist: textList('hwid_blacklist'),
    hwidWhitelist: textList('hwid_whitelist'),
    ipBlacklist: textList('ip_blacklist'),
    ipWhitelist: textList('ip_whitelist'),
    createdAt: createdAt(),
  },
  (t) => [index('apps_account_idx').on(t.accountId, t.createdAt)],
)

export const signingKeys = pgTable(
  'signing_keys',
  {
    /** The keyId sent in signed responses. */
    id: text('id').primaryKey(),
    appId: uuid('app_id')
      .notNull()
      .references(() => apps.id, { onDelete: 'cascade' }),
    version: integer('version').notNull(),
    /** Raw 32-byte Ed25519 public key, base64. */
    publicKey: text('public_key').notNull(),
    /** PKCS#8 private key sealed with the master key (see lib/crypto.ts, Sealer). */
    privateKeyEnc: text('private_key_enc').notNull(),
    active: boolean('active').notNull().default(true),
    createdAt: createdAt(),
  },
  (t) => [uniqueIndex('signing_keys_app_version_idx').on(t.appId, t.version)],
)

export const licenses = pgTable(
  'licenses',
  {
    key: text('key').primaryKey(),
    appId: uuid('app_id')
      .notNull()
      .references(() => apps.id, { onDelete: 'cascade' }),
    status: text('status', { enum: ['active', 'revoked'] })
      .notNull()
      .default('active'),
    expiresAt: timestamp('expires_at', { withTimezone: true, precision: 3, mode: 'date' }),
    maxHwidSlots: integer('max_hwid_slots').notNull().default(1),
    unlimitedHwidSlots: boolean('unlimited_hwid_slots').notNull().default(false),
    hwids: textList('hwids'),
    label: text('label'),
    variables: jsonb('variables').$type<VariableMap>().notNull().default({}),
    createdAt: createdAt(),
  },
  // Keyset pagination walks (app_id, created_at DESC, key DESC).
  (t) => [index('licenses_app_created_idx').on(t.appId, t.createdAt, t.key)],
)

export const webhooks = pgTable(
  'webhooks',
  {
    id: text('id').primaryKey(),
    appId: uuid('app_id')
      .notNull()
      .references(() => apps.id, { onDelete: 'cascade' }),
    url: text('url').notNull(),
    events: text('events').array().notNull(),
    enabled: boolean('enabled').notNull().default(true),
    /** whsec_ secret sealed with the master key. */
    secretEnc: text('secret_enc').notNull(),
    lastDeliveryAt: timestamp('last_delivery_at', { withTimezone: true, precision: 3, mode: 'date' }),
    lastDeliveryStatus: integer('last_delivery_status'),
    createdAt: createdAt(),
  },
  (t) => [index('webhooks_app_idx').on(t.appId)],
)

/** The outbox: one row per event, written in the transaction of the change that caused it. */
export const events = pgTable(
  'events',
  {
    id: bigserial('id', { mode: 'number' }).primaryKey(),
    appId: uuid('app_id').notNull(),
    event: text('event').notNull(),
    data: jsonb('data').$type<Record<string, unknown>>().notNull(),
    occurredAt: timestamp('occurred_at', { withTimezone: true, precision: 3, mode: 'date' }).notNull(),
    /** Set once the event has been fanned out into webhook_deliveries. */
    dispatchedAt: timestamp('dispatched_at', { withTimezone: true, precision: 3, mode: 'date' }),
  },
  (t) => [index('events_undispatched_idx').on(t.id).where(sql`${t.dispatchedAt} IS NULL`)],
)

/**
 * The outbox of cache invalidations: one row per change of an app's cached state (its row, keys,
 * webhooks, licenses), written in the change's own transaction and deleted once the store's epochs
 * are bumped. A bump that failed (the store unreachable from the instance that made the change) or
 * never ran (that instance stopped first) is made by whichever instance sweeps the row first. No
 * foreign key: the row must not lock the app's row, which the change's own statements lock in an
 * order of their own.
 */
export const cacheInvalidations = pgTable('cache_invalidations', {
  id: bigserial('id', { mode: 'number' }).primaryKey(),
  appId: uuid('app_id').notNull(),
  /** The app's own entry changed (settings, lists, variables, signing key, webhooks). */
  app: boolean('app').notNull(),
  licenseKeys: text('license_keys').array().notNull(),
  notedAt: timestamp('noted_at', { withTimezone: true, precision: 3, mode: 'date' }).notNull().defaultNow(),
})

/** One attempt owed per (event, webhook). Claimed with SKIP LOCKED so one instance sends it. */
export const webhookDeliveries = pgTable(
  'webhook_deliveries',
  {
    /**
     * No foreign key to events: its check was a third of the outbox's database CPU per event, and
     * events are only ever deleted by the dispatcher's purge, which deletes their deliveries with them.
     */
    eventId: bigint('event_id', { mode: 'number' }).notNull(),
    /**
     * No foreign key to webhooks either: its cascade read the whole table (every account's deliveries of
     * the retention) for each webhook deleted, inside the app's write. A webhook's delete takes its
     * deliveries still owed with it (deleteWebhook); the attempted ones go with their events' purge.
     */
    webhookId: text('webhook_id').notNull(),
    /** Lease: a claim older than the lease is taken over by another instance. */
    claimedAt: timestamp('claimed_at', { withTimezone: true, precision: 3, mode: 'date' }),
    attemptedAt: timestamp('attempted_at', { withTimezone: true, precision: 3, mode: 'date' }),
    httpStatus: integer('http_status'),
  },
  (t) => [
    primaryKey({ columns: [t.eventId, t.webhookId] }),
    index('webhook_deliveries_pending_idx')
      .on(t.eventId)
      .where(sql`${t.attemptedAt} IS NULL`),
    // Each webhook's queue: a claim finds other accounts' due deliveries without reading through the
    // backlog of an account that has its share on the way (claim.ts).
    index('webhook_deliveries_pending_by_webhook_idx')
      .on(t.webhookId, t.eventId)
      .where(sql`${t.attemptedAt} IS NULL`),
  ],
)

/**
 * Idempotency record of each credit flush from the store into accounts.credits. Only an account's
 * newest can still be named by the store's flush record; the older go after an hour (settledFlushes).
 */
export const creditFlushes = pgTable(
  'credit_flushes',
  {
    id: uuid('id').primaryKey(),
    accountId: uuid('account_id')
      .notNull()
      .references(() => accounts.id, { onDelete: 'cascade' }),
    amount: bigint('amount', { mode: 'number' }).notNull(),
    createdAt: createdAt(),
  },
  (t) => [index('credit_flushes_account_idx').on(t.accountId, t.createdAt), index('credit_flushes_created_idx').on(t.createdAt)],
)

/**
 * One minted offline license file (`.authforge`). The file text is not kept: a delivered file cannot be
 * revoked, so the row is the record of what is out there (its id is the payload's `jti`).
 */
export const offlineFiles = pgTable(
  'offline_files',
  {
    id: uuid('id').primaryKey(),
    licenseKey: text('license_key')
      .notNull()
      .references(() => licenses.key, { onDelete: 'cascade' }),
    appId: uuid('app_id')
      .notNull()
      .references(() => apps.id, { onDelete: 'cascade' }),
    keyId: text('key_id').notNull(),
    issuedAt: timestamp('issued_at', { withTimezone: true, precision: 3, mode: 'date' }).notNull(),
    /** Null: the file never expires. */
    expiresAt: timestamp('expires_at', { withTimezone: true, precision: 3, mode: 'date' }),
    /** The payload's `hwid`: `{ mode: 'bound', hwids }` or `{ mode: 'any' }`. */
    hwid: jsonb('hwid').$type<OfflineHwid>().notNull(),
  },
  // The listing walks one license's files newest first.
  (t) => [index('offline_files_license_idx').on(t.licenseKey, t.issuedAt)],
)

/**
 * The check value of the master key the stored secrets are sealed with (src/lib/crypto.ts
 * keyCheckValue), one row: a process with another key refuses to start, and a sealing transaction
 * reads it FOR SHARE, so a master-key rotation (which rewrites it) and a seal under the old key never
 * both commit.
 */
export const masterKeyCheck = pgTable(
  'master_key_check',
  {
    id: smallint('id').primaryKey().default(1),
    value: text('value').notNull(),
    updatedAt: timestamp('updated_at', { withTimezone: true, precision: 3, mode: 'date' }).notNull().defaultNow(),
  },
  (t) => [check('master_key_check_one_row', sql`${t.id} = 1`)],
)
