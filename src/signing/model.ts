import { t } from 'elysia'
import { EXAMPLE } from '../lib/examples'
import { Count } from '../lib/model'

const variables = (description: string) =>
  t.Record(t.String(), t.Union([t.String(), t.Number(), t.Boolean()]), { description })

/** Names the decoded payload's schema in the OpenAPI document (components/schemas). */
export const SIGNED_PAYLOAD_MODEL = 'SignedPayload'

// A day after EXAMPLE.createdAt, as a default session would be.
const SESSION_EXPIRES_IN = 1795578939

/**
 * The JSON a signed `payload` decodes to, field for field as `SignedPayloads.sign` writes it (the
 * contract's "Signed payload" table). Later versions may add fields, so a client must ignore unknown ones.
 */
export const SignedPayload = t.Object(
  {
    sessionToken: t.String({ description: 'Opaque token for heartbeat and post-session selfban' }),
    expiresIn: Count({ description: 'Unix time in whole seconds at which the session expires' }),
    sessionExpiresAt: t.String({ format: 'date-time', description: 'The same instant, ISO 8601' }),
    timestamp: t.String({ format: 'date-time', description: 'When the response was issued' }),
    nonce: t.Optional(
      t.String({ description: "The request's nonce echoed back: validate always, heartbeat when the request sent one" }),
    ),
    appId: t.String({ format: 'uuid' }),
    licenseKey: t.String(),
    hwid: t.String({ description: 'The HWID that was authenticated' }),
    licenseExpiresAt: t.Nullable(t.String({ format: 'date-time', description: "The license's expiry; null: lifetime" })),
    unlimitedHwidSlots: t.Boolean(),
    maxHwidSlots: Count({ minimum: 1, maximum: 16 }),
    hwidCount: Count({ minimum: 0, description: 'HWIDs bound to the license now' }),
    licenseLabel: t.Nullable(t.String()),
    appVariables: variables("The app's variables"),
    licenseVariables: variables("The license's variables"),
  },
  {
    description: 'The decoded `payload` of a validate or heartbeat response (base64 of this JSON, UTF-8)',
    examples: [
      {
        sessionToken:
          'eyJ2IjoxLCJhcHAiOiIzZjZjMWE1Mi04ZTBiLTRkN2UtOWE0MS01YjJmMGM3ZDllMTMiLCJsaWMiOiJLN1FNLTNYV1QtOUhGUC0yUkROIiwia' +
          'HdpZCI6Imh3aWQtMmI4MWQwNGYiLCJ0dGwiOjg2NDAwLCJpYXQiOjE3OTU0OTI1MzksImV4cCI6MTc5NTU3ODkzOSwianRpIjoiazJKZDlReExt' +
          'MFpjIn0.JQAS5nrUwjLj9gSRgPodiTboLWAUiUZUEXGVQ4p1vho',
        expiresIn: SESSION_EXPIRES_IN,
        sessionExpiresAt: new Date(SESSION_EXPIRES_IN * 1000).toISOString(),
        timestamp: EXAMPLE.createdAt,
        nonce: 'c1d4e7a09b3f4e12',
        appId: EXAMPLE.appId,
        licenseKey: EXAMPLE.licenseKey,
        hwid: EXAMPLE.hwid,
        licenseExpiresAt: EXAMPLE.expiresAt,
        unlimitedHwidSlots: false,
        maxHwidSlots: 2,
        hwidCount: 1,
        licenseLabel: 'Order 10482',
        appVariables: EXAMPLE.variables,
        licenseVariables: {},
      },
    ],
  },
)

const PAYLOAD_EXAMPLE = Buffer.from(JSON.stringify(SignedPayload.examples[0]), 'utf8').toString('base64')

/** A signed payload as the client endpoints answer it: the response model of validate and heartbeat. */
export const SignedResponse = t.Object(
  {
    status: t.Literal('success'),
    payload: t.String({
      description: `Base64 of the payload JSON: decode it to a \`${SIGNED_PAYLOAD_MODEL}\` (sessionToken, expiresIn, nonce, license state, variables) after checking the signature`,
      contentEncoding: 'base64',
      contentMediaType: 'application/json',
      contentSchema: { $ref: `#/components/schemas/${SIGNED_PAYLOAD_MODEL}` },
    }),
    signature: t.String({
      description: 'Base64 Ed25519 signature over the UTF-8 bytes of `payload` as sent (88 characters)',
    }),
    keyId: t.String({ description: 'Signing key that produced the signature' }),
  },
  {
    description: `Signed: verify \`signature\` over \`payload\` with the app's public key, then decode \`payload\` (base64 JSON, the \`${SIGNED_PAYLOAD_MODEL}\` schema)`,
    examples: [
      {
        status: 'success',
        payload: PAYLOAD_EXAMPLE,
        signature: 'QWg8gwHGliYrezAnVii8Vvnv3iS/YuphvjlQ9QHC93XjrxH+XETCe84RCB7vMUUXQhz2Ub4MufRIBijoU+1WDg==',
        keyId: EXAMPLE.keyId,
      },
    ],
  },
)
