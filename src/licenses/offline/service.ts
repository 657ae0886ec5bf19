import { randomUUID } from 'node:crypto'
import { and, desc, eq, sql } from 'drizzle-orm'
import type { Tx } from '../../db/client'
import { apps, licenses, offlineFiles, type OfflineHwid } from '../../db/schema'
import type { Context } from '../../context'
import { ApiError, badRequest } from '../../lib/errors'
import { type DomainEvent, recordEvents } from '../../delivery/outbox'
import { hwidListsAllow } from '../../actors/list-append'
import { expiryFrom, lockLicense, type LicenseRow, requireOwnedLicense } from '../service'
import { armor, encodePayload, type OfflinePayload } from './armor'
import { olderThan, ROWS_PER_READ, streamedList } from '../../http/streamed-list'
import type { MintOfflineFileBody, OfflineFile, OfflineFileSummary } from './model'

type AppRow = typeof apps.$inferSelect

/** What a mint will do to a license as it stands: the file's expiry and machines, and the HWIDs to bind. */
interface MintPlan {
  expiresAt: Date | null
  hwid: OfflineHwid
  newHwids: string[]
}

const seatsFull = (message: string) => new ApiError('seats_full', 409, message)

/**
 * What a validate would refuse on the app's side is refused here too: a file minted for a disabled app
 * or a blocked machine would verify offline for as long as it lasts. Run on the app row as read (before
 * the charge) and as locked in the minting transaction.
 */
function checkApp(app: AppRow, machines: MintPlan['hwid']): void {
  if (app.disabled) throw new ApiError('app_disabled', 409, 'The app is disabled: enable it to mint offline files')
  // A file for any machine verifies beyond a whitelist, which admits only its own machines. (It cannot
  // honour the blacklist either: the README says so.)
  if (machines.mode === 'any' && app.hwidWhitelist.length > 0) {
    throw new ApiError('hwid_blocked', 409, "A file for any machine would verify on machines the app's HWID whitelist refuses")
  }
  const hwids = machines.mode === 'bound' ? machines.hwids : []
  const [blacklist, whitelist] = [new Set(app.hwidBlacklist), new Set(app.hwidWhitelist)]
  const blocked = hwids.findIndex((hwid) => !hwidListsAllow(blacklist, whitelist, hwid))
  if (blocked >= 0) {
    throw new ApiError('hwid_blocked', 409, `HWID ${blocked + 1} of the file is refused by the app's HWID blacklist or whitelist`)
  }
}

// What one SDK or another trims off the machine's HWID before comparing: JavaScript's trim, and Python's
// strip also \x1c-\x1f and \x85 (Go's TrimSpace, Rust's trim and C#'s Trim \x85 too).
const SDK_TRIMMED = /^[\s\x1c-\x1f\x85]|[\s\x1c-\x1f\x85]$/

/** An HWID no SDK would match: a file bound to it never verifies. */
export const neverVerifies = (hwid: string) => hwid === '' || SDK_TRIMMED.test(hwid)
export const NEVER_VERIFIES =
  "begins or ends with white space: the SDKs trim the machine's HWID before comparing, so a file bound to it would never verify"

/**
 * Checks a mint against the license row. Run twice: on the row as read (so a request that must fail
 * costs no credit) and on the row locked in the minting transaction (what decides).
 */
function planMint(row: LicenseRow, input: MintOfflineFileBody, now: Date): MintPlan {
  if (row.status !== 'active' || (row.expiresAt && row.expiresAt <= now)) {
    throw new ApiError('license_inactive', 409, `License ${row.key} is ${row.status === 'active' ? 'expired' : 'revoked'}`)
  }
  const expiresAt = input.expiresAt === undefined ? row.expiresAt : expiryFrom(input.expiresAt)
  if (row.expiresAt && (expiresAt === null || expiresAt > row.expiresAt)) {
    throw badRequest(`expiresAt must not be later than the license's expiry, ${row.expiresAt.toISOString()}`)
  }
  if (expiresAt && expiresAt <= now) throw badRequest('expiresAt must be in the future')
  if (input.anyMachine) {
    if (input.hwids) throw badRequest('Give hwids or anyMachine, not both')
    if (!row.unlimitedHwidSlots) throw badRequest('anyMachine is only allowed for unlimited-seat licenses')
    return { expiresAt, hwid: { mode: 'any' }, newHwids: [] }
  }
  // The bound HWIDs too: validate binds an HWID as the client sent it.
  const untrimmed = (input.hwids ?? row.hwids).findIndex(neverVerifies)
  if (untrimmed >= 0) {
    const which = input.hwids ? `hwids.${untrimmed}` : `The license's bound HWID ${untrimmed + 1} (give hwids)`
    throw badRequest(`${which} ${NEVER_VERIFIES}`)
  }
  const hwids = input.hwids ? [...new Set(input.hwids)] : row.hwids
  if (hwids.length === 0) throw badRequest('The license has no bound HWID: give hwids')
  // An unlimited-seat license binds nothing, as on validate.
  const newHwids = row.unlimitedHwidSlots ? [] : hwids.filter((hwid) => !row.hwids.includes(hwid))
  if (newHwids.length > 0 && row.hwids.length + newHwids.length > row.maxHwidSlots) {
    throw seatsFull(`${newHwids.length} new HWIDs but ${Math.max(0, row.maxHwidSlots - row.hwids.length)} free seats`)
  }
  return { expiresAt, hwid: { mode: 'bound', hwids }, newHwids }
}

/**
 * Binds the new HWIDs in one conditional UPDATE, as the seat binder does: the condition (not the row
 * lock alone) is what keeps every instance's binds within the seats.
 */
async function bindSeats(tx: Tx, row: LicenseRow, newHwids: string[], now: Date): Promise<DomainEvent[]> {
  if (newHwids.length === 0) return []
  const list = sql`ARRAY[${sql.join(newHwids.map((h) => sql`${h}::text`), sql`, `)}]`
  const bound = await tx
    .update(licenses)
    .set({ hwids: sql`${licenses.hwids} || ${list}` })
    .where(
      and(
        eq(licenses.key, row.key),
        eq(licenses.status, 'active'),
        sql`NOT (${licenses.hwids} && ${list})`,
        sql`cardinality(${licenses.hwids}) + ${newHwids.length}::int <= ${licenses.maxHwidSlots}`,
      ),
    )
    .returning({ key: licenses.key })
  if (bound.length === 0) throw seatsFull('The free seats were taken meanwhile')
  return newHwids.map((hwid) => ({ event: 'license.hwid_bound', data: { licenseKey: row.key, appId: row.appId, hwid }, occurredAt: now }))
}

/**
 * In the caller's transaction: lock the app and the license, bind the license's new seats, sign the
 * file with the app's active key, record it and its events.
 */
async function mint(ctx: Context, tx: Tx, app: AppRow, licenseKey: string, input: MintOfflineFileBody, appIdAsSpelled: string) {
  const now = new Date(ctx.clock())
  // FOR SHARE: a disable, a list or variables change committing meanwhile waits for this file, or
  // this sees it: the file is checked against, and carries, the app as it stands at the commit.
  const [locked] = await tx.select().from(apps).where(eq(apps.id, app.id)).for('share')
  if (!locked) throw new ApiError('not_found', 404, `No license ${licenseKey}`)
  const row = await lockLicense(tx, licenseKey)
  // Under the app's lock, which a rotation takes for update: the key is the app's active one at the commit.
  const signing = await ctx.actors.loadSigningKey(app.id, tx)
  if (!signing) throw new Error(`app ${app.id} has no active signing key`)
  const plan = planMint(row, input, now)
  checkApp(locked, plan.hwid)
  const events = await bindSeats(tx, row, plan.newHwids, now)
  const payload: OfflinePayload = {
    appId: appIdAsSpelled,
    licenseKey,
    jti: randomUUID(),
    kid: signing.keyId,
    issuedAt: now,
    expiresAt: plan.expiresAt,
    hwid: plan.hwid,
    label: row.label,
    licenseExpiresAt: row.expiresAt,
    licenseVariables: row.variables,
    appVariables: locked.variables,
  }
  const payloadBase64 = encodePayload(payload)
  const signature = await ctx.signer.sign(signing.keyId, signing.key, payloadBase64)
  await tx.insert(offlineFiles).values({
    id: payload.jti,
    licenseKey,
    appId: app.id,
    keyId: signing.keyId,
    issuedAt: now,
    expiresAt: plan.expiresAt,
    hwid: plan.hwid,
  })
  const expiresAt = plan.expiresAt?.toISOString() ?? null
  events.push({
    event: 'license.offline_issued',
    data: { licenseKey, appId: app.id, fileId: payload.jti, hwid: plan.hwid, expiresAt },
    occurredAt: now,
  })
  await recordEvents(tx, events)
  const file: OfflineFile = {
    fileId: payload.jti,
    licenseKey,
    appId: app.id,
    keyId: signing.keyId,
    issuedAt: now.toISOString(),
    expiresAt,
    hwid: plan.hwid,
    file: armor(payload, payloadBase64, signature),
  }
  return { file, bound: plan.newHwids.length > 0 }
}

/**
 * Mints a signed offline license file. A billed app's account pays 1 credit, taken from the live
 * balance before the transaction (so two instances never spend the same credit) and given back if
 * the mint then fails. The file names the app as `appIdAsSpelled` when given (an activation request's
 * spelling, which its SDK compares exactly), else as stored.
 */
export async function mintOfflineFile(
  ctx: Context,
  accountId: string,
  licenseKey: string,
  input: MintOfflineFileBody,
  appIdAsSpelled?: string,
): Promise<OfflineFile> {
  const owned = await requireOwnedLicense(ctx, accountId, licenseKey)
  const plan = planMint(owned, input, new Date(ctx.clock()))
  const [app] = await ctx.database.db.select().from(apps).where(eq(apps.id, owned.appId)).limit(1)
  if (!app) throw new ApiError('not_found', 404, `No license ${licenseKey}`)
  checkApp(app, plan.hwid)
  const charge = app.sandbox ? null : await ctx.credits.charge(accountId, 1, ctx.clock())
  if (!app.sandbox && !charge) {
    throw new ApiError('no_credits', 402, 'The account has no credits left; add credits to mint offline files')
  }
  try {
    const minted = await ctx.actors.write(
      app.id,
      (tx) => mint(ctx, tx, app, licenseKey, input, appIdAsSpelled ?? app.id),
      ({ bound }) => ({ licenses: bound ? [licenseKey] : [], events: true }),
    )
    return minted.file
  } catch (err) {
    // Thrown before the commit (AppActor.write publishes without throwing): nothing was minted.
    if (charge) await ctx.credits.refund(accountId, 1, charge.chargedUnder)
    throw err
  }
}

const summaryOf = (row: typeof offlineFiles.$inferSelect): OfflineFileSummary => ({
  fileId: row.id,
  keyId: row.keyId,
  issuedAt: row.issuedAt.toISOString(),
  expiresAt: row.expiresAt?.toISOString() ?? null,
  hwid: row.hwid,
})

/**
 * The license's minted files, newest first (keyset on issuedAt, id), streamed: a license's files are
 * never purged (a volume license gets one per machine, again at each short expiry).
 */
export async function listOfflineFiles(ctx: Context, accountId: string, licenseKey: string): Promise<Response> {
  await requireOwnedLicense(ctx, accountId, licenseKey)
  const db = ctx.database.db
  return streamedList(
    'files',
    (after: typeof offlineFiles.$inferSelect | null) =>
      db
        .select()
        .from(offlineFiles)
        .where(and(eq(offlineFiles.licenseKey, licenseKey), olderThan(offlineFiles.issuedAt, offlineFiles.id, after && { time: after.issuedAt, id: after.id })))
        .orderBy(desc(offlineFiles.issuedAt), desc(offlineFiles.id))
        .limit(ROWS_PER_READ),
    summaryOf,
  )
}
