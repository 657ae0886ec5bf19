import { t } from 'elysia'
import { StrictBody, Text } from '../lib/model'

export const AppIdParams = t.Object({ appId: Text({ description: 'Application ID (UUID)' }) })

const AppName = (options: { examples?: string[] } = {}) => Text({ ...options, minLength: 1, maxLength: 128 })

export const CreateAppBody = StrictBody({
  name: AppName(),
  sandbox: t.Optional(t.Boolean({ default: false, description: 'Sandbox apps are never billed' })),
})

export const CreatedAppResponse = t.Object({
  appId: t.String({ format: 'uuid' }),
  name: t.String(),
  sandbox: t.Boolean(),
  appSecret: t.String({ description: 'Shown only in this response; store it now' }),
  publicKey: t.String({ description: 'Raw 32-byte Ed25519 public key, base64' }),
  keyId: t.String(),
  createdAt: t.String({ format: 'date-time' }),
})

/**
 * An app as listed and as PATCH returns it: never its secret or keys. Examples sit on the fields: the
 * OpenAPI generator lifts a response schema's own keywords out of the schema.
 */
export const AppSummary = t.Object({
  appId: t.String({ format: 'uuid', examples: ['3f6c1a52-8e0b-4d7e-9a41-5b2f0c7d9e13'] }),
  name: t.String({ examples: ['Acme Desktop'] }),
  sandbox: t.Boolean({ examples: [false] }),
  disabled: t.Boolean({
    description: 'A disabled app answers every client call with 403 app_disabled',
    examples: [true],
  }),
  createdAt: t.String({ format: 'date-time', examples: ['2026-11-24T03:55:39.120Z'] }),
})

export const UpdateAppBody = StrictBody(
  {
    name: t.Optional(AppName({ examples: ['Acme Desktop 2'] })),
    disabled: t.Optional(
      t.Boolean({
        description: 'true: every client call gets 403 app_disabled; false: they work again',
        examples: [true],
      }),
    ),
  },
  { description: 'At least one field; an omitted field is unchanged', minProperties: 1 },
)

export const AppSecretResponse = t.Object({
  appSecret: t.String({
    description: 'Shown only in this response; the previous secret no longer works',
    examples: ['q3Vt8bN0cJ2mX5rW7yL1aZ4dF6hK9pS0uE2gI8oT3vB'],
  }),
})

export const AppListResponse = t.Object({ apps: t.Array(AppSummary) })

export const SigningKeyListResponse = t.Object({
  keys: t.Array(
    t.Object({
      keyId: t.String(),
      publicKey: t.String({ description: 'Raw 32-byte Ed25519 public key, base64' }),
      active: t.Boolean({ description: 'True for the key that signs now' }),
      createdAt: t.String({ format: 'date-time' }),
    }),
  ),
})

export const RotatedKeyResponse = t.Object({ keyId: t.String(), publicKey: t.String() })
