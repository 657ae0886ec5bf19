import { and, eq } from 'drizzle-orm'
import { apps, licenses, type VariableMap } from '../db/schema'
import type { Context } from '../context'
import { badRequest, notFound } from '../lib/errors'
import { characters } from '../lib/model'
import { requireOwnedApp } from '../apps/service'
import { requireOwnedLicense } from '../licenses/service'

export const MAX_VARIABLES = 50
export const MAX_VARIABLE_KEY_LENGTH = 64
export const MAX_VARIABLES_BYTES = 4096

/** Checks a variable map against the contract: flat, scalar values, bounded in count and size. */
export function checkVariables(input: unknown): VariableMap {
  if (typeof input !== 'object' || input === null || Array.isArray(input)) {
    throw badRequest('The body must be a JSON object of variables')
  }
  const entries = Object.entries(input)
  if (entries.length > MAX_VARIABLES) throw badRequest(`At most ${MAX_VARIABLES} variables per map`)
  for (const [key, value] of entries) {
    const length = characters(key)
    if (length < 1 || length > MAX_VARIABLE_KEY_LENGTH) {
      throw badRequest(`Variable names are 1 to ${MAX_VARIABLE_KEY_LENGTH} characters`)
    }
    const ok =
      typeof value === 'string' ||
      typeof value === 'boolean' ||
      (typeof value === 'number' && Number.isFinite(value))
    if (!ok) throw badRequest(`Variable "${key}" must be a string, number or boolean`)
  }
  if (Buffer.byteLength(JSON.stringify(input), 'utf8') > MAX_VARIABLES_BYTES) {
    throw badRequest(`A variable map is at most ${MAX_VARIABLES_BYTES} bytes of JSON`)
  }
  return input as VariableMap
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
  input: unknown,
) {
  const variables = checkVariables(input)
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
  input: unknown,
) {
  const variables = checkVariables(input)
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
