import { createPublicKey, randomBytes, verify } from 'node:crypto'
import { eq } from 'drizzle-orm'
import { generateLicenseKey } from '../../src/lib/crypto'
import { licenses } from '../../src/db/schema'
import type { Context } from '../../src/context'
import { keys } from '../../src/store/store'

/** Inserts a license straight into the database (the client tests do not depend on the Developer API). */
export async function insertLicense(
  ctx: Context,
  appId: string,
  opts: Partial<typeof licenses.$inferInsert> = {},
): Promise<string> {
  const key = generateLicenseKey()
  await ctx.database.db.insert(licenses).values({ key, appId, ...opts })
  return key
}

/** Changes a license row behind the actors' back and bumps its epoch after commit, as another process's publish would. */
export async function updateLicense(ctx: Context, key: string, set: Partial<typeof licenses.$inferInsert>) {
  const [row] = await ctx.database.db.select({ appId: licenses.appId }).from(licenses).where(eq(licenses.key, key))
  if (!row) throw new Error(`no license ${key}`)
  const epochKey = await licenseEpochKey(ctx, row.appId, key)
  await ctx.database.db.update(licenses).set(set).where(eq(licenses.key, key))
  await ctx.store.bump([epochKey])
}

/** The epoch key of an app, in its account's shard. */
export async function appEpochKey(ctx: Context, appId: string): Promise<string> {
  return keys.appEpoch((await ctx.actors.shardOfApp(appId)) as string, appId)
}

/** The epoch key of a license of the app, in its account's shard. */
export async function licenseEpochKey(ctx: Context, appId: string, key: string): Promise<string> {
  return keys.licenseEpoch((await ctx.actors.shardOfApp(appId)) as string, key)
}

export const nonce = () => randomBytes(16).toString('hex')
export const hwid = () => randomBytes(16).toString('hex')

/** Verifies like the public SDKs: Ed25519 over the payload string as received, raw 32-byte public key. */
export function verifySigned(body: { payload: string; signature: string }, publicKeyB64: string): boolean {
  const key = createPublicKey({
    key: { kty: 'OKP', crv: 'Ed25519', x: Buffer.from(publicKeyB64, 'base64').toString('base64url') },
    format: 'jwk',
  })
  return verify(null, Buffer.from(body.payload, 'utf8'), key, Buffer.from(body.signature, 'base64'))
}

export const decode = (payload: string) => JSON.parse(Buffer.from(payload, 'base64').toString('utf8'))

/** `exp` from the first base64url part of a session token, as the SDK reads it. */
export const tokenExp = (token: string) =>
  JSON.parse(Buffer.from(token.split('.')[0] ?? '', 'base64url').toString('utf8')).exp as number

/** A validate on `on` (which caches the app and license there); `token` is the session when it passed. */
export async function validateOn(
  on: { req: (method: string, path: string, init: { body: unknown }) => Promise<{ status: number; body: any }> },
  app: { appId: string; appSecret: string },
  licenseKey: string,
  device = hwid(),
) {
  const res = await on.req('POST', '/auth/validate', {
    body: { appId: app.appId, appSecret: app.appSecret, licenseKey, hwid: device, nonce: nonce() },
  })
  return { res, device, token: res.status === 200 ? (decode(res.body.payload).sessionToken as string) : '' }
}

/** A heartbeat on `on` of a session validateOn returned. */
export const heartbeatOn = (
  on: { req: (method: string, path: string, init: { body: unknown }) => Promise<{ status: number; body: any }> },
  appId: string,
  session: { token: string; device: string },
) => on.req('POST', '/auth/heartbeat', { body: { appId, sessionToken: session.token, hwid: session.device } })
