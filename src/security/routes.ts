import { Elysia } from 'elysia'
import { addEntry, getSecurity, type ListKind, putSecurity, removeEntry } from './service'
import type { Context } from '../context'
import { apiKeyAuth } from '../http/auth'
import { apiBodyErrors, apiErrors } from '../http/openapi'
import { OkBody } from '../lib/model'
import { AppIdParams } from '../apps/model'
import { PutSecurityBody, SecurityConfig, SecurityEntryBody } from './model'

const tags = ['Security']

const entryRoute = (kind: ListKind, verb: 'add' | 'remove') => ({
  apiKey: true as const,
  params: AppIdParams,
  body: SecurityEntryBody,
  response: { 200: OkBody, ...apiBodyErrors('forbidden') },
  detail: {
    // addBlacklistEntry, removeWhitelistEntry, …
    operationId: `${verb}${kind === 'blacklist' ? 'Blacklist' : 'Whitelist'}Entry`,
    tags,
    summary: `${verb === 'add' ? 'Add an entry to' : 'Remove an entry from'} the ${kind}`,
    description:
      verb === 'add'
        ? `Adding an entry already present is a no-op 200; a full list (1,000 entries) gets 400.${
            kind === 'whitelist' ? ' The first entry of a type turns its allowlist mode on.' : ''
          }`
        : `Removing an absent entry is a no-op 200.${
            kind === 'whitelist'
              ? ' Removing the last entry of a type turns its allowlist mode off.'
              : ''
          }`,
  },
})

export const securityRoutes = (ctx: Context) =>
  new Elysia({ name: 'routes-security', prefix: '/v1/apps/:appId/security' })
    .use(apiKeyAuth(ctx))
    .get('', ({ accountId, params }) => getSecurity(ctx, accountId, params.appId), {
      apiKey: true,
      params: AppIdParams,
      response: { 200: SecurityConfig, ...apiErrors('bad_request', 'forbidden') },
      detail: {
        operationId: 'getSecurityLists',
        tags,
        summary: 'Get the security lists',
        description: 'HWID and IP blacklists and whitelists.',
      },
    })
    .put('', ({ accountId, params, body }) => putSecurity(ctx, accountId, params.appId, body), {
      apiKey: true,
      params: AppIdParams,
      body: PutSecurityBody,
      response: { 200: SecurityConfig, ...apiBodyErrors('forbidden') },
      detail: {
        operationId: 'replaceSecurityLists',
        tags,
        summary: 'Replace security lists',
        description:
          'Each supplied list replaces the stored one (deduplicated, order kept; IPs stored canonical); ' +
          'omitted lists are unchanged; [] clears. Over 1,000 entries or an invalid entry gets 400.',
      },
    })
    .post(
      '/blacklist',
      ({ accountId, params, body }) => addEntry(ctx, accountId, params.appId, 'blacklist', body),
      entryRoute('blacklist', 'add'),
    )
    .delete(
      '/blacklist',
      ({ accountId, params, body }) =>
        removeEntry(ctx, accountId, params.appId, 'blacklist', body),
      entryRoute('blacklist', 'remove'),
    )
    .post(
      '/whitelist',
      ({ accountId, params, body }) => addEntry(ctx, accountId, params.appId, 'whitelist', body),
      entryRoute('whitelist', 'add'),
    )
    .delete(
      '/whitelist',
      ({ accountId, params, body }) =>
        removeEntry(ctx, accountId, params.appId, 'whitelist', body),
      entryRoute('whitelist', 'remove'),
    )
