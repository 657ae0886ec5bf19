import { Elysia } from 'elysia'
import Negotiator from 'negotiator'
import type { Context } from '../../context'
import { apiKeyAuth } from '../../http/auth'
import { ALSO_SERVES, apiBodyErrors, apiErrors, RESPONSE_HEADERS } from '../../http/openapi'
import { AppIdParams } from '../../apps/model'
import { LicenseKeyParams } from '../model'
import { answerActivationRequest } from './activation'
import { ActivationRequestBody, MintOfflineFileBody, OfflineFile, OfflineFileList } from './model'
import { listOfflineFiles, mintOfflineFile } from './service'

const tags = ['Offline licenses']

/** The media type of a `.authforge` file: asked for in Accept, the mint answers with the file itself. */
export const LICENSE_FILE_TYPE = 'application/x-authforge-license'

/** The 201 of a mint as the document lists it: JSON, or the file itself when Accept asks for it. */
const SERVES_FILE = {
  [ALSO_SERVES]: {
    201: {
      [LICENSE_FILE_TYPE]: {
        schema: { type: 'string', description: 'The armored .authforge file, as an attachment named <licenseKey>.authforge' },
      },
    },
  },
  [RESPONSE_HEADERS]: {
    201: {
      'Content-Disposition': {
        description: `With the file (\`Accept: ${LICENSE_FILE_TYPE}\`): an attachment named \`<licenseKey>.authforge\`.`,
        schema: { type: 'string', examples: ['attachment; filename="K7QM-3XWT-9HFP-2RDN.authforge"'] },
      },
    },
  },
}

/** What a mint's 201 can be: JSON first, so a tie (no Accept, a wildcard range) is JSON. */
const MINT_ANSWERS = ['application/json', LICENSE_FILE_TYPE]

/**
 * Whether Accept ranks the file above JSON (by q, then how specific the range, then its order): a range
 * at `q=0` refuses its type (RFC 9110), and an Accept that takes neither still gets JSON.
 */
const wantsFile = (accept: string | undefined) =>
  new Negotiator({ headers: { accept } }).mediaType(MINT_ANSWERS) === LICENSE_FILE_TYPE

/** 201 with the minted record, or with the file itself when Accept asks for it. */
function created(minted: OfflineFile, accept: string | undefined, set: { status?: number | string; headers: Record<string, unknown> }) {
  set.status = 201
  if (!wantsFile(accept)) return minted
  set.headers['content-type'] = LICENSE_FILE_TYPE
  set.headers['content-disposition'] = `attachment; filename="${minted.licenseKey}.authforge"`
  return new Response(minted.file, { status: 201, headers: set.headers as Record<string, string> })
}

/** What a mint can be refused with, from a file request or an activation request alike. */
const MINT_ERRORS = [
  'forbidden',
  'not_found',
  'no_credits',
  'seats_full',
  'license_inactive',
  'app_disabled',
  'hwid_blocked',
] as const

export const offlineFileRoutes = (ctx: Context) =>
  new Elysia({ name: 'routes-offline-files', prefix: '/v1/licenses' })
    .use(apiKeyAuth(ctx))
    .post(
      '/:licenseKey/offline-files',
      async ({ accountId, params, body, headers, set }) => {
        return created(await mintOfflineFile(ctx, accountId, params.licenseKey, body), headers.accept, set)
      },
      {
        apiKey: true,
        params: LicenseKeyParams,
        body: MintOfflineFileBody,
        response: { 201: OfflineFile, ...apiBodyErrors(...MINT_ERRORS) },
        detail: {
          operationId: 'mintOfflineFile',
          ...SERVES_FILE,
          tags,
          summary: 'Mint a signed offline license file',
          description:
            'Returns an AuthForge `.authforge` file the SDKs (1.4 on) verify with no network: Ed25519-signed by ' +
            "the app's active signing key, bound to `hwids` (new ones take free seats first, atomically; 409 " +
            "seats_full and nothing bound when there are too few), to the license's bound HWIDs when omitted, or to " +
            'any machine (`anyMachine`, unlimited-seat licenses only). 1 credit on a billed app (402 no_credits), ' +
            'free on a sandbox app. 409 license_inactive for a revoked or expired license, app_disabled for a ' +
            "disabled app, hwid_blocked for an HWID the app's HWID lists refuse (as a validate would) or for any " +
            'machine while the app has an HWID whitelist. Emits ' +
            'license.offline_issued. With `Accept: application/x-authforge-license` the 201 body is the file itself, ' +
            'as an attachment named `<licenseKey>.authforge`. A delivered file cannot be revoked: give short ' +
            'expiries.',
        },
      },
    )
    .get(
      '/:licenseKey/offline-files',
      ({ accountId, params }) => listOfflineFiles(ctx, accountId, params.licenseKey),
      {
        apiKey: true,
        params: LicenseKeyParams,
        response: { 200: OfflineFileList, ...apiErrors('bad_request', 'forbidden', 'not_found') },
        detail: {
          operationId: 'listOfflineFiles',
          tags,
          summary: 'List the offline files of a license',
          description:
            'Every file minted for the license, newest first: id, signing key, dates and machines (the text is ' +
            'not kept). 404 for an absent key, 403 for a license of another account.',
        },
      },
    )

export const activationRequestRoutes = (ctx: Context) =>
  new Elysia({ name: 'routes-activation-requests', prefix: '/v1/apps' })
    .use(apiKeyAuth(ctx))
    .post(
      '/:appId/activation-requests',
      async ({ accountId, params, body, headers, set }) =>
        created(await answerActivationRequest(ctx, accountId, params.appId, body), headers.accept, set),
      {
        apiKey: true,
        params: AppIdParams,
        body: ActivationRequestBody,
        response: { 201: OfflineFile, ...apiBodyErrors(...MINT_ERRORS) },
        detail: {
          operationId: 'answerActivationRequest',
          ...SERVES_FILE,
          tags,
          summary: "Answer an air-gapped machine's activation request with a license file",
          description:
            'Takes the `.authforge-request` an SDK (1.4 on) wrote on a machine with no network, sent as is ' +
            '(`Content-Type: text/plain`, e-mail text around it allowed) or as `{ request, licenseKey?, expiresAt? }` ' +
            "JSON. The request is verified (armor, checksum, version, this app's `App-Id` and `appId`), its HWID " +
            "takes a seat of the license (the body's `licenseKey`, else the request's own; it must be this app's) " +
            'and a file bound to that HWID is minted exactly as `POST /v1/licenses/{licenseKey}/offline-files` ' +
            'does: 409 seats_full, license_inactive, app_disabled or hwid_blocked, 1 credit on a billed app (402 no_credits), the ' +
            'license.offline_issued event. A refused request changes nothing. 403 for an app of another ' +
            'account, 404 for an absent license. 400 when the request has no block or is truncated, has a bad ' +
            "checksum, an unsupported version or a malformed payload, is another app's or a license file, has an HWID " +
            "outside 1 to 128 characters, or names no license (and the body gives none) or another app's. " +
            'With `Accept: application/x-authforge-license` the 201 body is ' +
            'the file itself, as an attachment named `<licenseKey>.authforge`.',
        },
      },
    )
