import { t } from 'elysia'
import { EVENT_NAMES } from '../delivery/outbox'
import { EXAMPLE } from '../lib/examples'
import { Count, StrictBody, Text } from '../lib/model'
import { MAX_WEBHOOK_URL_LENGTH } from '../delivery/target'

const isoDate = (description: string) => t.String({ format: 'date-time', description })
const WEBHOOK_URL = 'https://example.com/hooks/licenses'
const EVENTS_EXAMPLE = ['license.created', 'license.revoked']

const EventName = t.Union(
  EVENT_NAMES.map((name) => t.Literal(name)),
  { description: 'A subscribable event (test.ping is sent by the test operation only)' },
)

const Url = Text({
  maxLength: MAX_WEBHOOK_URL_LENGTH,
  description:
    'HTTPS endpoint receiving deliveries. Refused when its host resolves to a loopback, private, link-local ' +
    'or otherwise non-public address (unless the server sets WEBHOOK_ALLOW_PRIVATE_TARGETS=true).',
  examples: [WEBHOOK_URL],
})

const Events = t.Array(EventName, {
  minItems: 1,
  maxItems: 32,
  description: 'Subscribed event names; duplicates are stored once',
})

const appId = Text({ description: 'Owning application', examples: [EXAMPLE.appId] })
export const AppParams = t.Object({ appId })

export const WebhookParams = t.Object({
  appId,
  webhookId: Text({ description: 'wh_…', examples: [EXAMPLE.webhookId] }),
})

const WEBHOOK_EXAMPLE = {
  webhookId: EXAMPLE.webhookId,
  appId: EXAMPLE.appId,
  url: WEBHOOK_URL,
  events: EVENTS_EXAMPLE,
  enabled: true,
  lastDeliveryAt: EXAMPLE.createdAt,
  lastDeliveryStatus: 200,
  createdAt: EXAMPLE.createdAt,
}

/** A webhook as list returns it: never the secret. */
export const Webhook = t.Object({
  webhookId: t.String(),
  appId: t.String({ format: 'uuid' }),
  url: t.String(),
  events: t.Array(t.String()),
  enabled: t.Boolean(),
  lastDeliveryAt: t.Nullable(isoDate('Time of the latest delivery attempt (a test ping counts); null before the first')),
  lastDeliveryStatus: t.Nullable(
    Count({
      description:
        "The receiver's HTTP status on the latest attempt; 0 when no response came back (timeout after 10 s, " +
        'connection refused or reset, TLS or DNS failure, or a target refused by the private-address guard); ' +
        'null before the first attempt',
    }),
  ),
  createdAt: isoDate('Creation time'),
}, { examples: [WEBHOOK_EXAMPLE] })

/** The create response: the only place the signing secret is ever shown. */
export const CreatedWebhook = t.Composite([
  Webhook,
  t.Object({
    secret: t.String({
      description: 'whsec_… HMAC-SHA256 key of X-Service-Signature; shown only here, not retrievable again',
    }),
  }),
], {
  description: 'The new webhook, with its signing secret (shown only here)',
  examples: [{ ...WEBHOOK_EXAMPLE, lastDeliveryAt: null, lastDeliveryStatus: null, secret: EXAMPLE.webhookSecret }],
})

export const CreateWebhookBody = StrictBody(
  {
    url: Url,
    events: Events,
    enabled: t.Optional(t.Boolean({ default: true })),
  },
  { examples: [{ url: WEBHOOK_URL, events: EVENTS_EXAMPLE }] },
)

export const UpdateWebhookBody = StrictBody(
  {
    url: t.Optional(Url),
    events: t.Optional(Events),
    enabled: t.Optional(t.Boolean()),
  },
  { examples: [{ enabled: false }, { events: ['license.validated'] }] },
)

export const WebhookList = t.Object(
  { webhooks: t.Array(Webhook) },
  { description: "The app's webhooks, oldest first", examples: [{ webhooks: [WEBHOOK_EXAMPLE] }] },
)

export const TestPingResponse = t.Object(
  {
    ok: t.Literal(true),
    status: Count({
      description: "The receiver's HTTP status, or 0 when no response came back (see lastDeliveryStatus)",
    }),
  },
  { description: "The ping was sent; the receiver's answer", examples: [{ ok: true, status: 204 }] },
)
