import { Elysia } from 'elysia'
import type { Context } from '../../context'
import { apiKeyAuth } from '../../http/auth'
import { apiErrors, noCreditsError, notFoundError } from '../../lib/model'
import { LicenseKeyParams } from '../model'
import { conflictError, MintOfflineFileBody, OfflineFile, OfflineFileList } from './model'
import { listOfflineFiles, mintOfflineFile } from './service'

const tags = ['Offline licenses']

/** The media type of a `.authforge` file: asked for in Accept, the mint answers with the file itself. */
export const LICENSE_FILE_TYPE = 'application/x-authforge-license'

const wantsFile = (accept: string | undefined) =>
  accept?.split(',').some((range) => range.split(';')[0]?.trim().toLowerCase() === LICENSE_FILE_TYPE) ?? false

export const offlineFileRoutes = (ctx: Context) =>
  new Elysia({ name: 'routes-offline-files', prefix: '/v1/licenses' })
    .use(apiKeyAuth(ctx))
    .post(
      '/:licenseKey/offline-files',
      async ({ accountId, params, body, headers, set }) => {
        const minted = await mintOfflineFile(ctx, accountId, params.licenseKey, body)
        set.status = 201
        if (!wantsFile(headers.accept)) return minted
        set.headers['content-type'] = LICENSE_FILE_TYPE
        set.headers['content-disposition'] = `attachment; filename="${minted.licenseKey}.authforge"`
        return new Response(minted.file, { status: 201, headers: set.headers as Record<string, string> })
      },
      {
        apiKey: true,
        params: LicenseKeyParams,
        body: MintOfflineFileBody,
        response: { 201: OfflineFile, ...apiErrors, ...noCreditsError, ...notFoundError, ...conflictError },
        detail: {
          tags,
          summary: 'Mint a signed offline license file',
          description:
            'Returns an AuthForge `.authforge` file the SDKs (1.4 on) verify with no network: Ed25519-signed by ' +
            "the app's active signing key, bound to `hwids` (new ones take free seats first, atomically; 409 " +
            "seats_full and nothing bound when there are too few), to the license's bound HWIDs when omitted, or to " +
            'any machine (`anyMachine`, unlimited-seat licenses only). 1 credit on a billed app (402 no_credits), ' +
            'free on a sandbox app. 409 license_inactive for a revoked or expired license. Emits ' +
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
        response: { 200: OfflineFileList, ...apiErrors, ...notFoundError },
        detail: {
          tags,
          summary: 'List the offline files of a license',
          description:
            'Every file minted for the license, newest first: id, signing key, dates and machines (the text is ' +
            'not kept). 404 for an absent key, 403 for a license of another account.',
        },
      },
    )
