import { and, desc, eq, sql } from 'drizzle-orm'
import type { Tx } from '../db/client'
import { apps, licenses } from '../db/schema'
import type { Context } from '../context'
import { ApiError, badRequest, forbidden, notFound } from '../lib/errors'
import { requireOwnedApp } from '../apps/service'
import { generateLicenseKey, LICENSE_KEY_PATTERN } from '../lib/crypto'
import { type DomainEvent, type EventData, type EventName, recordEvents } from '../delivery/outbox'
import { parseIsoTimestamp } from '../lib/time'
import { decodeCursor, encodeCursor } from './cursor'
import {
  type CreateLicensesBody,
  HWID_SLOTS,
  type License,
  type LicenseDetail,
  type LicenseWithHwids,
  type ListLicensesQuery,
  type ListLicensesResponse,
  type UpdateLicenseBody,
  type UpdateLicenseResponse,
} from './model'

export type LicenseRow = typeof licenses.$inferSelect

/** A license as the Developer API shows it (create shape: no hwidList). */
export function licenseView(row: LicenseRow): License {
  return {
    licenseKey: row.key,
    appId: row.appId,
    status: row.status,
    expiresAt: row.expiresAt ? row.expiresAt.toISOString() : null,
    maxHwidSlots: row.maxHwidSlots,
    unlimitedHwidSlots: row.unlimitedHwidSlots,
    label: row.label,
    createdAt: row.createdAt.toISOString(),
  }
}

export function licenseWithHwids(row: LicenseRow): LicenseWithHwids {
  return { ...licenseView(row), hwidList: [...row.hwids] }
}

const KEY_SHAPE = new RegExp(LICENSE_KEY_PATTERN)
const MAX_KEY_ATTEMPTS = 8

/**
 * The instants an expiry may name. PostgreSQL's timestamptz starts in 4713 BC, but a Date is sent to it
 * as toISOString text, which has no form PostgreSQL reads for year 0 or for years past 9999.
 */
const EXPIRY_RANGE = { min: Date.UTC(1970, 0, 1), max: Date.UTC(9999, 11, 31, 23, 59, 59, 999) } as const

/** An expiry from a request: null for null or absent; 400 when not ISO 8601 or out of range. */
export function expiryFrom(text: string | null | undefined): Date | null {
  if (text === undefined || text === null) return null
  const date = parseIsoTimestamp(text)
  if (!date) throw badRequest('expiresAt must be an ISO 8601 timestamp or null')
  const ms = date.getTime()
  if (ms < EXPIRY_RANGE.min || ms > EXPIRY_RANGE.max) {
    throw badRequest('expiresAt must lie from 1970-01-01T00:00:00Z to 9999-12-31T23:59:59.999Z')
  }
  return date
}

function event(ctx: Context, name: EventName, data: EventData): DomainEvent {
  return { event: name, data, occurredAt: new Date(ctx.clock()) }
}

type NewLicense = Omit<typeof licenses.$inferInsert, 'key' | 'createdAt'>

/** Inserts `quantity` licenses with fresh keys and their license.created events, in the caller's transaction. */
async function insertLicenses(ctx: Context, tx: Tx, values: NewLicense, quantity: number, newKey: () => string) {
  const createdAt = new Date(ctx.clock())
  const created: LicenseRow[] = []
  // 80 random bits make a clash rare, not impossible: the loser of ON CONFLICT gets a new key.
  for (let attempt = 0; created.length < quantity; attempt++) {
    if (attempt === MAX_KEY_ATTEMPTS) throw new Error('could not generate unique license keys')
    const batch = Array.from({ length: quantity - created.length }, () => ({
      ...values,
      key: newKey(),
      createdAt,
    }))
    created.push(
      ...(await tx
        .insert(licenses)
        .values(batch)
        .onConflictDoNothing({ target: licenses.key })
        .returning()),
    )
  }
  await recordEvents(
    tx,
    created.map((row) =>
      event(ctx, 'license.created', {
        licenseKey: row.key,
        appId: row.appId,
        expiresAt: row.expiresAt?.toISOString() ?? null,
        maxHwidSlots: row.maxHwidSlots,
        unlimitedHwidSlots: row.unlimitedHwidSlots,
        label: row.label,
      }),
    ),
  )
  return created
}

/**
 * The seats a new license records. The spec ignores maxHwidSlots on an unlimited-seat license, so any
 * integer is taken there, and one no license may hold is recorded as the default.
 */
function hwidSlotsOf(input: CreateLicensesBody): number {
  const slots = input.maxHwidSlots ?? 1
  const valid = slots >= HWID_SLOTS.minimum && slots <= HWID_SLOTS.maximum
  if (input.unlimitedHwidSlots) return valid ? slots : 1
  if (!valid) throw badRequest(`maxHwidSlots must be an integer from ${HWID_SLOTS.minimum} to ${HWID_SLOTS.maximum}`)
  return slots
}

/** `newKey` is the key source; tests pass one that repeats keys to exercise the clash path. */
export async function createLicenses(
  ctx: Context,
  accountId: string,
  input: CreateLicensesBody,
  newKey: () => string = generateLicenseKey,
): Promise<License[]> {
  const expiresAt = expiryFrom(input.expiresAt)
  const maxHwidSlots = hwidSlotsOf(input)
  const app = await requireOwnedApp(ctx, accountId, input.appId)
  // The contract asks for a positive balance and spends nothing; the live balance is the one the client
  // endpoints spend from (the reconciled one trails it).
  if ((await ctx.credits.currentBalance(accountId)) <= 0) {
    throw new ApiError(
      'no_credits',
      402,
      'The account has no credits left; add credits to create licenses',
    )
  }
  const quantity = input.quantity ?? 1
  const values: NewLicense = {
    appId: app.id,
    expiresAt,
    maxHwidSlots,
    unlimitedHwidSlots: input.unlimitedHwidSlots ?? false,
    label: input.label ?? null,
  }
  const rows = await ctx.actors.write(
    app.id,
    (tx) => insertLicenses(ctx, tx, values, quantity, newKey),
    // A key cached as absent anywhere (looked up before it existed) must be read again.
    (created) => ({ licenses: created.map((row) => row.key), events: true }),
  )
  return rows.map(licenseView)
}

/** Finds a license of the account: 404 when absent (or not shaped like a key), 403 when another account's. */
export async function requireOwnedLicense(
  ctx: Context,
  accountId: string,
  licenseKey: string,
): Promise<LicenseRow> {
  // Not echoed: it is any text of the URL, control characters and kilobytes of it included.
  if (!KEY_SHAPE.test(licenseKey)) throw notFound('No license: that is not a license key (XXXX-XXXX-XXXX-XXXX)')
  const [found] = await ctx.database.db
    .select({ license: licenses, accountId: apps.accountId })
    .from(licenses)
    .innerJoin(apps, eq(apps.id, licenses.appId))
    .where(eq(licenses.key, licenseKey))
    .limit(1)
  if (!found) throw notFound(`No license ${licenseKey}`)
  if (found.accountId !== accountId)
    throw forbidden('This license belongs to an app outside your account')
  return found.license
}

/** The single-license view; `hwid` is the first bound HWID (the oldest binding) or null. */
const licenseDetail = (row: LicenseRow): LicenseDetail => ({ ...licenseWithHwids(row), hwid: row.hwids[0] ?? null })

export async function getLicense(ctx: Context, accountId: string, licenseKey: string): Promise<LicenseDetail> {
  return licenseDetail(await requireOwnedLicense(ctx, accountId, licenseKey))
}

/**
 * Frees the seat of one bound HWID in one conditional UPDATE (the condition, not the actor, settles a race
 * with another instance); 404 when it is not bound. Its sessions then fail their next heartbeat, which
 * checks the HWID is bound. No event: the spec's list names none for one released seat.
 */
export async function releaseHwid(ctx: Context, accountId: string, licenseKey: string, hwid: string): Promise<LicenseDetail> {
  const owned = await requireOwnedLicense(ctx, accountId, licenseKey)
  const [row] = await ctx.actors.write(
    owned.appId,
    (tx) =>
      tx
        .update(licenses)
        .set({ hwids: sql`array_remove(${licenses.hwids}, ${hwid}::text)` })
        .where(and(eq(licenses.key, licenseKey), sql`${hwid}::text = ANY(${licenses.hwids})`))
        .returning(),
    (released) => (released.length > 0 ? { licenses: [licenseKey] } : {}),
  )
  if (!row) throw notFound(`HWID ${JSON.stringify(hwid)} is not bound to license ${licenseKey}`)
  return licenseDetail(row)
}

/** Newest first (created_at DESC, key DESC); the cursor is the last row's position, keyset style. */
export async function listLicenses(
  ctx: Context,
  accountId: string,
  input: ListLicensesQuery,
): Promise<ListLicensesResponse> {
  const app = await requireOwnedApp(ctx, accountId, input.appId)
  const after = input.cursor === undefined ? null : decodeCursor(ctx, app.id, input.cursor)
  const limit = input.limit ?? 50
  const rows = await ctx.database.db
    .select()
    .from(licenses)
    .where(
      and(
        eq(licenses.appId, app.id),
        after
          ? sql`(${licenses.createdAt}, ${licenses.key}) < (${after.createdAt}::timestamptz, ${after.key})`
          : undefined,
      ),
    )
    .orderBy(desc(licenses.createdAt), desc(licenses.key))
    .limit(limit + 1)
  const page = rows.slice(0, limit)
  const last = page[page.length - 1]
  return {
    licenses: page.map(licenseWithHwids),
    cursor: rows.length > limit && last ? encodeCursor(ctx, last) : null,
  }
}

/** Works out the change an action makes to a locked row: the new column values and the event, if any. */
function planUpdate(
  row: LicenseRow,
  input: UpdateLicenseBody,
): { set: Partial<LicenseRow>; event: EventName | null; extra: Record<string, unknown> } {
  switch (input.action) {
    case 'revoke':
      return row.status === 'revoked'
        ? { set: {}, event: null, extra: {} }
        : { set: { status: 'revoked' }, event: 'license.revoked', extra: { status: 'revoked' } }
    case 'activate':
      return row.status === 'active'
        ? { set: {}, event: null, extra: {} }
        : { set: { status: 'active' }, event: 'license.activated', extra: { status: 'active' } }
    case 'extend':
      return { set: { expiresAt: expiryFrom(input.expiresAt) }, event: null, extra: {} }
    case 'reset-hwid':
      return {
        set: { hwids: [] },
        event: 'license.hwid_reset',
        extra: { previousHwidList: row.hwids },
      }
  }
}

/** Reads the license under a row lock, for a change that depends on what it holds; 404 when deleted meanwhile. */
export async function lockLicense(tx: Tx, licenseKey: string): Promise<LicenseRow> {
  const [row] = await tx.select().from(licenses).where(eq(licenses.key, licenseKey)).for('update')
  // Deleted between the ownership check and the lock.
  if (!row) throw notFound(`No license ${licenseKey}`)
  return row
}

/**
 * Applies the action to the license under a row lock: the lock, not the actor, is what orders updates
 * of one license across processes sharing the database.
 */
async function applyUpdate(ctx: Context, tx: Tx, licenseKey: string, input: UpdateLicenseBody) {
  const current = await lockLicense(tx, licenseKey)
  const plan = planUpdate(current, input)
  if (Object.keys(plan.set).length === 0) return { row: current, changed: false }
  const [updated] = await tx.update(licenses).set(plan.set).where(eq(licenses.key, licenseKey)).returning()
  if (!updated) throw new Error('locked license vanished during update')
  if (plan.event) {
    await recordEvents(tx, [event(ctx, plan.event, { licenseKey, appId: updated.appId, ...plan.extra })])
  }
  return { row: updated, changed: true }
}

export async function updateLicense(
  ctx: Context,
  accountId: string,
  licenseKey: string,
  input: UpdateLicenseBody,
): Promise<UpdateLicenseResponse> {
  // The schema has the expiry's shape; its calendar and range are refused before anything is read.
  if (input.action === 'extend') expiryFrom(input.expiresAt)
  const owned = await requireOwnedLicense(ctx, accountId, licenseKey)
  const { row } = await ctx.actors.write(
    owned.appId,
    (tx) => applyUpdate(ctx, tx, licenseKey, input),
    ({ changed }) => (changed ? { licenses: [licenseKey], events: true } : {}),
  )
  return { ok: true as const, license: licenseWithHwids(row) }
}

async function removeLicense(ctx: Context, tx: Tx, licenseKey: string) {
  const [deleted] = await tx.delete(licenses).where(eq(licenses.key, licenseKey)).returning()
  if (!deleted) throw notFound(`No license ${licenseKey}`)
  await recordEvents(tx, [
    event(ctx, 'license.deleted', {
      licenseKey,
      appId: deleted.appId,
      status: deleted.status,
      hwidList: deleted.hwids,
    }),
  ])
}

export async function deleteLicense(ctx: Context, accountId: string, licenseKey: string) {
  const owned = await requireOwnedLicense(ctx, accountId, licenseKey)
  await ctx.actors.write(
    owned.appId,
    (tx) => removeLicense(ctx, tx, licenseKey),
    () => ({ licenses: [licenseKey], events: true }),
  )
  return { ok: true as const }
}
