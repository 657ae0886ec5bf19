import { t } from 'elysia'
import { StrictBody, Text } from '../lib/model'

export const AppIdParams = t.Object({ appId: Text({ description: 'Application ID (UUID)' }) })

export const CreateAppBody = StrictBody({
  name: Text({ minLength: 1, maxLength: 128 }),
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

export const AppSummary = t.Object({
  appId: t.String({ format: 'uuid' }),
  name: t.String(),
  sandbox: t.Boolean(),
  createdAt: t.String({ format: 'date-time' }),
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
