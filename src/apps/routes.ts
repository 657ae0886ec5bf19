import { Elysia } from 'elysia'
import {
  createApplication,
  listApps,
  listSigningKeys,
  requireOwnedApp,
  rotateAppSecret,
  rotateSigningKey,
  updateApp,
} from './service'
import type { Context } from '../context'
import { apiKeyAuth } from '../http/auth'
import { noBody } from '../http/no-body'
import { apiBodyErrors, apiErrors } from '../http/openapi'
import {
  AppIdParams,
  AppListResponse,
  AppSecretResponse,
  AppSummary,
  CreateAppBody,
  CreatedAppResponse,
  RotatedKeyResponse,
  SigningKeyListResponse,
  UpdateAppBody,
} from './model'

export const appRoutes = (ctx: Context) =>
  new Elysia({ name: 'routes-apps', prefix: '/v1' })
    .use(apiKeyAuth(ctx))
    .use(noBody)
    .post(
      '/apps',
      async ({ accountId, body, set }) => {
        const app = await createApplication(ctx, accountId, body.name, body.sandbox ?? false)
        set.status = 201
        return app
      },
      {
        apiKey: true,
        body: CreateAppBody,
        response: { 201: CreatedAppResponse, ...apiBodyErrors() },
        detail: {
          operationId: 'createApp',
          tags: ['Apps'],
          summary: 'Create an app',
          description:
            'Returns the app secret (only here) and the public key that verifies signed responses.',
        },
      },
    )
    .get('/apps', ({ accountId }) => listApps(ctx, accountId), {
      apiKey: true,
      response: { 200: AppListResponse, ...apiErrors() },
      detail: { operationId: 'listApps', tags: ['Apps'], summary: "List the account's apps", description: 'Newest first.' },
    })
    .get(
      '/apps/:appId/signing-keys',
      async ({ accountId, params }) => {
        const app = await requireOwnedApp(ctx, accountId, params.appId)
        return listSigningKeys(ctx, app.id)
      },
      {
        apiKey: true,
        params: AppIdParams,
        response: { 200: SigningKeyListResponse, ...apiErrors('bad_request', 'forbidden') },
        detail: {
          operationId: 'listSigningKeys',
          tags: ['Apps'],
          summary: 'List signing keys',
          description:
            'Newest first. The active key signs; earlier keys stay listed so clients can trust several.',
        },
      },
    )
    .post(
      '/apps/:appId/signing-keys',
      async ({ accountId, params, set }) => {
        const app = await requireOwnedApp(ctx, accountId, params.appId)
        const key = await rotateSigningKey(ctx, app.id)
        set.status = 201
        return key
      },
      {
        apiKey: true,
        noBody: true,
        params: AppIdParams,
        response: { 201: RotatedKeyResponse, ...apiBodyErrors('forbidden') },
        detail: {
          operationId: 'rotateSigningKey',
          tags: ['Apps'],
          summary: 'Rotate the signing key',
          description:
            'The new key signs from now on; earlier keys stay listed with active: false.',
        },
      },
    )
    .patch('/apps/:appId', ({ accountId, params, body }) => updateApp(ctx, accountId, params.appId, body), {
      apiKey: true,
      params: AppIdParams,
      body: UpdateAppBody,
      response: { 200: AppSummary, ...apiBodyErrors('forbidden') },
      detail: {
        operationId: 'updateApp',
        tags: ['Apps'],
        summary: 'Rename, disable or re-enable an app',
        description:
          'name (1 to 128 characters) and disabled, at least one. A disabled app answers every client call ' +
          '(validate, heartbeat, selfban) with 403 app_disabled from the next request on, on every instance; ' +
          'disabled: false lets them through again. Licenses, lists and keys are kept.',
      },
    })
    .post(
      '/apps/:appId/secret',
      async ({ accountId, params, set }) => {
        const secret = await rotateAppSecret(ctx, accountId, params.appId)
        set.status = 201
        return secret
      },
      {
        apiKey: true,
        noBody: true,
        params: AppIdParams,
        response: { 201: AppSecretResponse, ...apiBodyErrors('forbidden') },
        detail: {
          operationId: 'rotateAppSecret',
          tags: ['Apps'],
          summary: 'Rotate the app secret',
          description:
            'Returns a new app secret, shown only here (stored as its SHA-256). The previous secret fails ' +
            'with invalid_app from the next request on, on every instance; sessions already issued go on.',
        },
      },
    )
