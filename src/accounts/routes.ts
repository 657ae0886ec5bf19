import { Elysia } from 'elysia'
import { getAccount } from './service'
import type { Context } from '../context'
import { apiKeyAuth } from '../http/auth'
import { apiErrors } from '../http/openapi'
import { AccountResponse } from './model'

export const accountRoutes = (ctx: Context) =>
  new Elysia({ name: 'routes-account', prefix: '/v1' })
    .use(apiKeyAuth(ctx))
    .get('/account', ({ accountId }) => getAccount(ctx, accountId), {
      apiKey: true,
      // An API key belongs to its account (a foreign key), and accounts are never deleted: no 404.
      response: { 200: AccountResponse, ...apiErrors() },
      detail: {
        operationId: 'getAccount',
        tags: ['Account'],
        summary: 'The account of the API key',
        description: 'Name and credit balance.',
      },
    })
