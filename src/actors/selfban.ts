import { and, eq } from 'drizzle-orm'
import type { Tx } from '../db/client'
import { licenses } from '../db/schema'
import { recordEvents } from '../delivery/outbox'
import { PublicError } from '../lib/errors'
import { appendEntry } from './list-append'
import { holdsSeat } from './load'

/** What a selfban asks for: the caller has already applied the mode's defaults. */
export interface SelfbanWish {
  revokeLicense: boolean
  blacklistHwid: boolean
  blacklistIp: boolean
  hwid: string
  ip: string
  /**
   * Post-session: the session is the device's only while `hwid` holds a seat of the license. Released or
   * reset, the seat may be another device's by now, and the old session (valid until it expires) must
   * not revoke that device's license.
   */
  sessionHwid: boolean
}

/** What it changed: a part already in place (revoked license, listed entry) reports false. */
export interface SelfbanDone {
  revokeLicense: boolean
  blacklistHwid: boolean
  blacklistIp: boolean
}

/**
 * In the caller's transaction (AppActor.write) the revoke and the list appends commit together or not at all. Each is a conditional UPDATE, so a
 * license revoked or an entry listed meanwhile by another process is simply not reported. The lists
 * (the app's row) go first: an offline mint locks the app row and then the license, so locking them the
 * other way round, a selfban and a mint of one license in two processes could deadlock.
 */
export async function applySelfban(
  tx: Tx,
  appId: string,
  licenseKey: string,
  want: SelfbanWish,
  now: Date,
): Promise<SelfbanDone> {
  const done = { revokeLicense: false, blacklistHwid: false, blacklistIp: false }
  if (want.blacklistHwid) done.blacklistHwid = await appendEntry(tx, appId, 'hwidBlacklist', want.hwid)
  if (want.blacklistIp) done.blacklistIp = await appendEntry(tx, appId, 'ipBlacklist', want.ip)
  if (want.sessionHwid) {
    // After the lists (the app's row): the lock order of an offline mint. Checked under the license's
    // lock, so a release committing on another instance meanwhile is seen; refused, nothing is changed.
    const [seat] = await tx
      .select({ hwids: licenses.hwids, unlimitedHwidSlots: licenses.unlimitedHwidSlots })
      .from(licenses)
      .where(and(eq(licenses.key, licenseKey), eq(licenses.appId, appId)))
      .for('update')
    if (!seat || !holdsSeat(seat, want.hwid)) throw new PublicError('session_expired')
  }
  if (want.revokeLicense) {
    const rows = await tx
      .update(licenses)
      .set({ status: 'revoked' })
      .where(and(eq(licenses.key, licenseKey), eq(licenses.appId, appId), eq(licenses.status, 'active')))
      .returning({ key: licenses.key })
    done.revokeLicense = rows.length > 0
    if (done.revokeLicense) {
      await recordEvents(tx, [{ event: 'license.revoked', data: { licenseKey, appId, status: 'revoked', reason: 'selfban' }, occurredAt: now }])
    }
  }
  return done
}
