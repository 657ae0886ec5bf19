import type { Context } from '../../context'
import { badRequest } from '../../lib/errors'
import { requireOwnedApp } from '../../apps/service'
import { requireOwnedLicense } from '../service'
import type { ActivationRequestBody, OfflineFile } from './model'
import { parseActivationRequest } from './request'
import { mintOfflineFile, NEVER_VERIFIES, neverVerifies } from './service'

/**
 * Answers an air-gapped machine's activation request: verifies it is this app's, then mints a file
 * bound to its HWID through the ordinary mint (its seat, credit, event and expiry rules). Every check
 * here runs before the mint, so a refused request changes nothing.
 */
export async function answerActivationRequest(
  ctx: Context,
  accountId: string,
  appId: string,
  body: ActivationRequestBody,
): Promise<OfflineFile> {
  // app.id is the id as stored (lower case); the path and the request may spell it in upper case.
  const app = await requireOwnedApp(ctx, accountId, appId)
  const options = typeof body === 'string' ? { request: body } : body
  const request = parseActivationRequest(options.request, app.id)
  // The caller's key first: the request's is whatever the customer wrote (its checksum is no signature).
  if (options.licenseKey === undefined && request.licenseKeyRefusal) throw badRequest(`Activation request refused: ${request.licenseKeyRefusal}`)
  const licenseKey = options.licenseKey ?? request.licenseKey
  if (!licenseKey) throw badRequest('Activation request refused: it names no license; give licenseKey in the body')
  const license = await requireOwnedLicense(ctx, accountId, licenseKey)
  if (license.appId !== app.id) throw badRequest(`Activation request refused: license ${licenseKey} belongs to another app`)
  if (neverVerifies(request.hwid)) throw badRequest(`Activation request refused: its HWID ${NEVER_VERIFIES}`)
  const mint = options.expiresAt === undefined ? { hwids: [request.hwid] } : { hwids: [request.hwid], expiresAt: options.expiresAt }
  return mintOfflineFile(ctx, accountId, licenseKey, mint, request.appId)
}
