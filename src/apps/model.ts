import { t } from 'elysia'
import { StrictBody, Text } from '../lib/model'

export const AppIdParams = t.Object({ appId: Text({ description: 'Application ID (UUID)' }) })

export const AccountResponse = t.Object({
  accountId: t.String({ format: 'uuid' }),
  name: t.String(),
  credits: t.Integer({ description: 'Credit balance' }),
})

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

/** A flat variable map: 1 to 64 character names, scalar values, at most 50 names and 4,096 bytes of JSON. */
export const VariableMapBody = t.Record(
  Text({ minLength: 1, maxLength: 64 }),
  t.Union([Text(), t.Number(), t.Boolean()]),
  {
    description: 'Flat map of variables; string, number or boolean values',
    examples: [{ tier: 'pro', seats: 5, beta: true }],
  },
)
