import { and, eq } from 'drizzle-orm'
import { apps, licenses, type VariableMap } from '../db/schema'
import type { Context } from '../context'
import { badRequest, notFound } from '../lib/errors'
import { MAX_VARIABLES_BYTES } from './model'
import { requireOwnedApp } from '../apps/service'
import { requireOwnedLicense } from '../licenses/service'

/**
 * What the schema (VariableMapBody) cannot say of a variable map: that it is an object before Elysia
 * would coerce an array or a string into one, and its size as JSON. Run before validation (the routes' transform).
 */
export function checkVariables(input: unknown): void {
  if (typeof input !== 'object' || input === null || Array.isArray(input)) {
    throw badRequest('The body must be a JSON object of variables')
  }
  if (Buffer.byteLength(JSON.stringify(input), 'utf8') > MAX_VARIABLES_BYTES) {
    throw badRequest(`A variable map is at most ${MAX_VARIABLES_BYTES} bytes of JSON`)
  }
}

export async function getAppVariables(
  ctx: Context,
  accountId: string,
  appId: string,
): Promise<VariableMap> {
  const app = await requireOwnedApp(ctx, accountId, appId)
  return app.variables
}

/** Replaces the whole map; every instance's cached copy of the app is dropped. */
export async function putAppVariables(
  ctx: Context,
  accountId: string,
  appId: string,
  variables: VariableMap,
) {
  const app = await requireOwnedApp(ctx, accountId, appId)
  const [row] = await ctx.actors.write(
    app.id,
    (tx) =>
      tx
        .update(apps)
        .set({ variables })
        .where(and(eq(apps.id, app.id), eq(apps.accountId, accountId)))
        .returning({ variables: apps.variables }),
    ([updated]) => ({ app: updated !== undefined }),
  )
  if (!row) throw new Error('owned app vanished during update')
  return row.variables
}

export async function getLicenseVariables(
  ctx: Context,
  accountId: string,
  licenseKey: string,
): Promise<VariableMap> {
  const license = await requireOwnedLicense(ctx, accountId, licenseKey)
  return license.variables
}

export async function putLicenseVariables(
  ctx: Context,
  accountId: string,
  licenseKey: string,
  variables: VariableMap,
) {
  const license = await requireOwnedLicense(ctx, accountId, licenseKey)
  const [row] = await ctx.actors.write(
    license.appId,
    (tx) =>
      tx
        .update(licenses)
        .set({ variables })
        .where(eq(licenses.key, license.key))
        .returning({ variables: licenses.variables }),
    ([updated]) => ({ licenses: updated ? [license.key] : [] }),
  )
  if (!row) throw notFound(`No license ${licenseKey}`)
  return row.variables
}
