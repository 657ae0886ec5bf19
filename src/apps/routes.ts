import { Elysia } from 'elysia'
import {
  createApplication,
  getAccount,
  listSigningKeys,
  requireOwnedApp,
  rotateSigningKey,
} from '../accounts/service'
import { listApps } from './service'
import {
  checkVariables,
  getAppVariables,
  getLicenseVariables,
  putAppVariables,
  putLicenseVariables,
} from '../variables/service'
import type { Context } from '../context'
import { apiKeyAuth, authenticate } from '../http/auth'
import { apiErrors, notFoundError } from '../lib/model'
import {
  AccountResponse,
  AppIdParams,
  AppListResponse,
  CreateAppBody,
  CreatedAppResponse,
  RotatedKeyResponse,
  SigningKeyListResponse,
  VariableMapBody,
} from './model'
import { LicenseKeyParams } from '../licenses/model'

const variablesRules =
  'A flat JSON object: names of 1 to 64 characters, string, number or boolean values, at most 50 names ' +
  'and 4,096 bytes of JSON.'

/** Routes that name no app or license have nothing to forbid. */
const accountErrors = {
  400: apiErrors[400],
  401: apiErrors[401],
  429: apiErrors[429],
  500: apiErrors[500],
}

/** Elysia would coerce an array or a string into an object before validation: refuse them first. */
const objectBodyOnly = ({ body }: { body: unknown }) => {
  checkVariables(body)
}

export const appRoutes = (ctx: Context) =>
  new Elysia({ name: 'routes-apps', prefix: '/v1' })
    .use(apiKeyAuth(ctx))
    .get('/account', ({ accountId }) => getAccount(ctx, accountId), {
      apiKey: true,
      response: { 200: AccountResponse, ...accountErrors },
      detail: {
        tags: ['Account'],
        summary: 'The account of the API key',
        description: 'Name and credit balance.',
      },
    })
    .post(
      '/apps',
      async ({ accountId, body, set }) => {
        const app = await createApplication(ctx, accountId, body.name, body.sandbox ?? false)
        set.status = 201
        return { ...app, createdAt: app.createdAt.toISOString() }
      },
      {
        apiKey: true,
        body: CreateAppBody,
        response: { 201: CreatedAppResponse, ...accountErrors },
        detail: {
          tags: ['Apps'],
          summary: 'Create an app',
          description:
            'Returns the app secret (only here) and the public key that verifies signed responses.',
        },
      },
    )
    .get('/apps', async ({ accountId }) => ({ apps: await listApps(ctx, accountId) }), {
      apiKey: true,
      response: { 200: AppListResponse, ...accountErrors },
      detail: { tags: ['Apps'], summary: "List the account's apps", description: 'Newest first.' },
    })
    .get(
      '/apps/:appId/signing-keys',
      async ({ accountId, params }) => {
        const app = await requireOwnedApp(ctx, accountId, params.appId)
        const keys = await listSigningKeys(ctx, app.id)
        return { keys: keys.map((k) => ({ ...k, createdAt: k.createdAt.toISOString() })) }
      },
      {
        apiKey: true,
        params: AppIdParams,
        response: { 200: SigningKeyListResponse, ...apiErrors },
        detail: {
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
        params: AppIdParams,
        response: { 201: RotatedKeyResponse, ...apiErrors },
        detail: {
          tags: ['Apps'],
          summary: 'Rotate the signing key',
          description:
            'The new key signs from now on; earlier keys stay listed with active: false.',
        },
      },
    )
    .get(
      '/apps/:appId/variables',
      ({ accountId, params }) => getAppVariables(ctx, accountId, params.appId),
      {
        apiKey: true,
        params: AppIdParams,
        response: { 200: VariableMapBody, ...apiErrors },
        detail: {
          tags: ['Variables'],
          summary: 'Get app variables',
          description: 'The map itself; {} when none are set.',
        },
      },
    )
    .put(
      '/apps/:appId/variables',
      ({ accountId, params, body }) => putAppVariables(ctx, accountId, params.appId, body),
      {
        apiKey: true,
        params: AppIdParams,
        // Route transforms run before the macro's: authenticate first, so a keyless request gets 401.
        transform: [authenticate(ctx), objectBodyOnly],
        body: VariableMapBody,
        response: { 200: VariableMapBody, ...apiErrors },
        detail: {
          tags: ['Variables'],
          summary: 'Replace app variables',
          description: `Replaces the whole map (omitted names are removed; {} clears it). ${variablesRules}`,
        },
      },
    )
    .get(
      '/licenses/:licenseKey/variables',
      ({ accountId, params }) => getLicenseVariables(ctx, accountId, params.licenseKey),
      {
        apiKey: true,
        params: LicenseKeyParams,
        response: { 200: VariableMapBody, ...apiErrors, ...notFoundError },
        detail: {
          tags: ['Variables'],
          summary: 'Get license variables',
          description: 'The map itself; {} when none are set.',
        },
      },
    )
    .put(
      '/licenses/:licenseKey/variables',
      ({ accountId, params, body }) =>
        putLicenseVariables(ctx, accountId, params.licenseKey, body),
      {
        apiKey: true,
        params: LicenseKeyParams,
        // Route transforms run before the macro's: authenticate first, so a keyless request gets 401.
        transform: [authenticate(ctx), objectBodyOnly],
        body: VariableMapBody,
        response: { 200: VariableMapBody, ...apiErrors, ...notFoundError },
        detail: {
          tags: ['Variables'],
          summary: 'Replace license variables',
          description: `Replaces the whole map (omitted names are removed; {} clears it). ${variablesRules}`,
        },
      },
    )
