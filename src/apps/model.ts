import { t } from 'elysia'
import { StrictBody, Text } from '../lib/model'

export const AppIdParams = t.Object({ appId: Text({ description: 'Application ID (UUID)' }) })

const AppName = () => Text({ minLength: 1, maxLength: 128 })

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

const EXAMPLE_APP_ID = '3f6c1a52-8e0b-4d7e-9a41-5b2f0c7d9e13'

/** An app as listed and as PATCH returns it: never its secret or keys. */
export const AppSummary = t.Object(
  {
    appId: t.String({ format: 'uuid' }),
    name: t.String(),
    sandbox: t.Boolean(),
    disabled: t.Boolean({ description: 'A disabled app answers every client call with 403 app_disabled' }),
    createdAt: t.String({ format: 'date-time' }),
  },
  {
    examples: [
      { appId: EXAMPLE_APP_ID, name: 'Acme Desktop', sandbox: false, disabled: true, createdAt: '2026-11-24T03:55:39.120Z' },
    ],
  },
)

export const UpdateAppBody = StrictBody(
  {
    name: t.Optional(AppName()),
    disabled: t.Optional(t.Boolean({ description: 'true: every client call gets 403 app_disabled; false: they work again' })),
  },
  {
    description: 'At least one field; an omitted field is unchanged',
    minProperties: 1,
    examples: [{ disabled: true }, { name: 'Acme Desktop 2' }],
  },
)

export const AppSecretResponse = t.Object(
  { appSecret: t.String({ description: 'Shown only in this response; the previous secret no longer works' }) },
  { examples: [{ appSecret: 'q3Vt8bN0cJ2mX5rW7yL1aZ4dF6hK9pS0uE2gI8oT3vB' }] },
)

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
