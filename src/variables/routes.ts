import { Elysia } from 'elysia'
import {
  checkVariables,
  getAppVariables,
  getLicenseVariables,
  putAppVariables,
  putLicenseVariables,
} from './service'
import type { Context } from '../context'
import { apiKeyAuth, authenticate } from '../http/auth'
import { apiBodyErrors, apiErrors } from '../http/openapi'
import { AppIdParams } from '../apps/model'
import { LicenseKeyParams } from '../licenses/model'
import { MAX_VARIABLE_NAME_LENGTH, MAX_VARIABLES, MAX_VARIABLES_BYTES, VariableMapBody } from './model'

const variablesRules =
  `A flat JSON object: names of 1 to ${MAX_VARIABLE_NAME_LENGTH} characters, string, number or boolean values, ` +
  `at most ${MAX_VARIABLES} names and ${MAX_VARIABLES_BYTES.toLocaleString('en')} bytes of JSON.`

/** Elysia would coerce an array or a string into an object before validation: refuse them first. */
const objectBodyOnly = ({ body }: { body: unknown }) => {
  checkVariables(body)
}

export const variableRoutes = (ctx: Context) =>
  new Elysia({ name: 'routes-variables', prefix: '/v1' })
    .use(apiKeyAuth(ctx))
    .get(
      '/apps/:appId/variables',
      ({ accountId, params }) => getAppVariables(ctx, accountId, params.appId),
      {
        apiKey: true,
        params: AppIdParams,
        response: { 200: VariableMapBody, ...apiErrors('bad_request', 'forbidden') },
        detail: {
          operationId: 'getAppVariables',
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
        response: { 200: VariableMapBody, ...apiBodyErrors('forbidden') },
        detail: {
          operationId: 'replaceAppVariables',
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
        response: { 200: VariableMapBody, ...apiErrors('bad_request', 'forbidden', 'not_found') },
        detail: {
          operationId: 'getLicenseVariables',
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
        response: { 200: VariableMapBody, ...apiBodyErrors('forbidden', 'not_found') },
        detail: {
          operationId: 'replaceLicenseVariables',
          tags: ['Variables'],
          summary: 'Replace license variables',
          description: `Replaces the whole map (omitted names are removed; {} clears it). ${variablesRules}`,
        },
      },
    )
