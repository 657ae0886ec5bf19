import { Elysia } from 'elysia'
import { createWebhook, deleteWebhook, listWebhooks, sendTestPing, TEST_PINGS_PER_ACCOUNT, updateWebhook } from './service'
import type { Context } from '../context'
import { apiKeyAuth } from '../http/auth'
import { noBody } from '../http/no-body'
import { apiBodyErrors, apiErrors } from '../http/openapi'
import { OkBody } from '../lib/model'
import {
  AppParams,
  CreatedWebhook,
  CreateWebhookBody,
  TestPingResponse,
  UpdateWebhookBody,
  WebhookList,
  WebhookParams,
} from './model'

const tags = ['Webhooks']

export const webhookRoutes = (ctx: Context) =>
  new Elysia({ name: 'routes-webhooks' })
    .use(apiKeyAuth(ctx))
    .use(noBody)
    .post(
      '/v1/apps/:appId/webhooks',
      async ({ accountId, params, body, set }) => {
        const created = await createWebhook(ctx, accountId, params.appId, body)
        set.status = 201
        return created
      },
      {
        apiKey: true,
        params: AppParams,
        body: CreateWebhookBody,
        response: { 201: CreatedWebhook, ...apiBodyErrors('forbidden') },
        detail: {
          operationId: 'createWebhook',
          tags,
          summary: 'Create a webhook',
          description:
            'Subscribes an HTTPS endpoint to license events; at most 5 per app. The response carries the ' +
            '`whsec_` signing secret, shown only here. Deliveries are POSTs of `{ event, timestamp, data }` ' +
            'signed with `X-Service-Signature: sha256=<hex HMAC-SHA256 of the raw body>`, sent once ' +
            '(10 s timeout, no retries, redirects not followed).',
        },
      },
    )
    .get(
      '/v1/apps/:appId/webhooks',
      ({ accountId, params }) => listWebhooks(ctx, accountId, params.appId),
      {
        apiKey: true,
        params: AppParams,
        response: { 200: WebhookList, ...apiErrors('bad_request', 'forbidden') },
        detail: {
          operationId: 'listWebhooks',
          tags,
          summary: 'List webhooks',
          description: "The app's webhooks, oldest first, with their latest delivery attempt; never the secret.",
        },
      },
    )
    .put(
      '/v1/apps/:appId/webhooks/:webhookId',
      async ({ accountId, params, body }) => {
        await updateWebhook(ctx, accountId, params.appId, params.webhookId, body)
        return { ok: true as const }
      },
      {
        apiKey: true,
        params: WebhookParams,
        body: UpdateWebhookBody,
        response: { 200: OkBody, ...apiBodyErrors('forbidden', 'not_found') },
        detail: {
          operationId: 'updateWebhook',
          tags,
          summary: 'Update a webhook',
          description:
            'Changes only the fields included. Events already recorded are delivered to the webhooks ' +
            'subscribed and enabled when the dispatcher picks them up. 404 when the webhook is not in the app.',
        },
      },
    )
    .delete(
      '/v1/apps/:appId/webhooks/:webhookId',
      async ({ accountId, params }) => {
        await deleteWebhook(ctx, accountId, params.appId, params.webhookId)
        return { ok: true as const }
      },
      {
        apiKey: true,
        noBody: true,
        params: WebhookParams,
        response: { 200: OkBody, ...apiBodyErrors('forbidden', 'not_found') },
        detail: {
          operationId: 'deleteWebhook',
          tags,
          summary: 'Delete a webhook',
          description: 'Removes the webhook and any deliveries still owed to it. 404 when it is not in the app.',
        },
      },
    )
    .post(
      '/v1/apps/:appId/webhooks/:webhookId/test',
      ({ accountId, params }) => sendTestPing(ctx, accountId, params.appId, params.webhookId),
      {
        apiKey: true,
        noBody: true,
        params: WebhookParams,
        response: { 200: TestPingResponse, ...apiBodyErrors('forbidden', 'not_found') },
        detail: {
          operationId: 'pingWebhook',
          tags,
          summary: 'Send a test ping',
          description:
            'Sends a signed `test.ping` (data `{ licenseKey: "TEST-TEST-TEST-TEST", appId, webhookId, test: true }`) ' +
            "now, also to a disabled webhook, and answers with the receiver's HTTP status (0: no response " +
            'within 10 s, refused connection, TLS or DNS failure, or a non-public target). It counts as the ' +
            `webhook's latest delivery. At most ${TEST_PINGS_PER_ACCOUNT} test pings of an account are on their way at once; ` +
            'past that, 429 `rate_limited` without sending.',
        },
      },
    )
