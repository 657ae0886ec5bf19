import { Elysia } from 'elysia'
import {
  createLicenses,
  deleteLicense,
  getLicense,
  listLicenses,
  releaseHwid,
  updateLicense,
} from './service'
import type { Context } from '../context'
import { apiKeyAuth, authenticate } from '../http/auth'
import { noBody } from '../http/no-body'
import { apiBodyErrors, apiErrors } from '../http/openapi'
import { OkBody } from '../lib/model'
import {
  CreateLicensesBody,
  CreateLicensesResponse,
  LicenseDetail,
  LicenseHwidParams,
  LicenseKeyParams,
  LIST_LIMIT,
  ListLicensesQuery,
  ListLicensesResponse,
  UpdateLicenseBody,
  UpdateLicenseResponse,
} from './model'
import { checkQuery } from '../http/strict-query'

const tags = ['Licenses']

export const licenseRoutes = (ctx: Context) =>
  new Elysia({ name: 'routes-licenses', prefix: '/v1/licenses' })
    .use(apiKeyAuth(ctx))
    .use(noBody)
    .post(
      '',
      async ({ accountId, body, set }) => {
        set.status = 201
        return { licenses: await createLicenses(ctx, accountId, body) }
      },
      {
        apiKey: true,
        body: CreateLicensesBody,
        response: { 201: CreateLicensesResponse, ...apiBodyErrors('forbidden', 'no_credits') },
        detail: {
          operationId: 'createLicenses',
          tags,
          summary: 'Create licenses',
          description:
            'Issues 1 to 100 active licenses for an app of the account. Needs a positive credit balance ' +
            '(402 no_credits otherwise) but spends none. Emits license.created per key.',
        },
      },
    )
    .get('', ({ accountId, query }) => listLicenses(ctx, accountId, query), {
      apiKey: true,
      // Authenticated first: a request without a valid key learns that before its query's faults (401, not 400).
      transform: [authenticate(ctx), ({ request }) => checkQuery(request.url, { limit: LIST_LIMIT })],
      query: ListLicensesQuery,
      response: { 200: ListLicensesResponse, ...apiErrors('bad_request', 'forbidden') },
      detail: {
        operationId: 'listLicenses',
        tags,
        summary: 'List licenses of an app',
        description:
          'Newest first (createdAt descending, then licenseKey descending). A non-null cursor means more ' +
          'results: pass it back as `cursor`. A cursor this API did not return gets 400.',
      },
    })
    .get(
      '/:licenseKey',
      ({ accountId, params }) => getLicense(ctx, accountId, params.licenseKey),
      {
        apiKey: true,
        params: LicenseKeyParams,
        response: { 200: LicenseDetail, ...apiErrors('bad_request', 'forbidden', 'not_found') },
        detail: {
          operationId: 'getLicense',
          tags,
          summary: 'Get a license',
          description:
            'Returns the license with its bound HWIDs. `hwid` is the first (oldest) bound HWID, or null ' +
            'when none is bound. 404 for an absent key, 403 for a license of another account.',
        },
      },
    )
    .put(
      '/:licenseKey',
      ({ accountId, params, body }) => updateLicense(ctx, accountId, params.licenseKey, body),
      {
        apiKey: true,
        params: LicenseKeyParams,
        body: UpdateLicenseBody,
        response: { 200: UpdateLicenseResponse, ...apiBodyErrors('forbidden', 'not_found') },
        detail: {
          operationId: 'updateLicense',
          tags,
          summary: 'Revoke, activate, extend or reset the HWIDs of a license',
          description:
            'revoke: active to revoked (license.revoked); on a revoked license a no-op 200. ' +
            'activate: revoked to active (license.activated); on an active license a no-op 200. ' +
            'extend: sets expiresAt (required; null makes it lifetime) and keeps the status. ' +
            'reset-hwid: clears every bound HWID (license.hwid_reset). expiresAt with another action gets 400.',
        },
      },
    )
    .delete(
      '/:licenseKey',
      ({ accountId, params }) => deleteLicense(ctx, accountId, params.licenseKey),
      {
        apiKey: true,
        noBody: true,
        params: LicenseKeyParams,
        response: { 200: OkBody, ...apiBodyErrors('forbidden', 'not_found') },
        detail: {
          operationId: 'deleteLicense',
          tags,
          summary: 'Delete a license',
          description: 'Permanent. Bound devices fail their next heartbeat. Emits license.deleted.',
        },
      },
    )
    .delete(
      '/:licenseKey/hwids/:hwid',
      ({ accountId, params }) => releaseHwid(ctx, accountId, params.licenseKey, params.hwid),
      {
        apiKey: true,
        noBody: true,
        params: LicenseHwidParams,
        response: { 200: LicenseDetail, ...apiBodyErrors('forbidden', 'not_found') },
        detail: {
          operationId: 'releaseHwid',
          tags,
          summary: 'Release one HWID',
          description:
            "Frees that device's seat and returns the license as GET does. The device's sessions fail " +
            'their next heartbeat with session_expired; its next validate binds it again if a seat is free. ' +
            'No webhook event. 404 when the HWID is not bound (or the key is absent), 403 for a license of ' +
            'another account. An HWID of `.` or `..` cannot be named in a URL (clients collapse such a path ' +
            'segment); reset-hwid releases it.',
        },
      },
    )
