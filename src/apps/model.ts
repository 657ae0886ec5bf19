import { t } from 'elysia'
import { EXAMPLE } from '../lib/examples'
import { Chars, StrictBody, Text } from '../lib/model'

export const AppIdParams = t.Object({
  appId: Text({ description: 'Application ID (UUID)', examples: [EXAMPLE.appId] }),
})

const AppName = (options: { examples?: string[] } = {}) => Chars(1, 128, options)

export const CreateAppBody = StrictBody(
  {
    name: AppName({ examples: [EXAMPLE.appName] }),
    sandbox: t.Optional(t.Boolean({ default: false, description: 'Sandbox apps are never billed' })),
  },
  { examples: [{ name: EXAMPLE.appName, sandbox: false }] },
)

const publicKey = t.String({ description: 'Raw 32-byte Ed25519 public key, base64', examples: [EXAMPLE.publicKey] })
const keyId = t.String({ description: 'The signing key id', examples: [EXAMPLE.keyId] })

export const CreatedAppResponse = t.Object(
  {
    appId: t.String({ format: 'uuid' }),
    name: t.String(),
    sandbox: t.Boolean(),
    appSecret: t.String({ description: 'Shown only in this response; store it now' }),
    publicKey,
    keyId,
    createdAt: t.String({ format: 'date-time' }),
  },
  {
    description: 'The new app, with its secret (shown only here) and the public key that verifies its signatures',
    examples: [
      {
        appId: EXAMPLE.appId,
        name: EXAMPLE.appName,
        sandbox: false,
        appSecret: EXAMPLE.appSecret,
        publicKey: EXAMPLE.publicKey,
        keyId: EXAMPLE.keyId,
        createdAt: EXAMPLE.createdAt,
      },
    ],
  },
)

const APP_SUMMARY_EXAMPLE = {
  appId: EXAMPLE.appId,
  name: EXAMPLE.appName,
  sandbox: false,
  disabled: false,
  createdAt: EXAMPLE.createdAt,
}

/** An app as listed and as PATCH returns it: never its secret or keys. */
export const AppSummary = t.Object(
  {
    appId: t.String({ format: 'uuid' }),
    name: t.String(),
    sandbox: t.Boolean(),
    disabled: t.Boolean({ description: 'A disabled app answers every client call with 403 app_disabled' }),
    createdAt: t.String({ format: 'date-time' }),
  },
  { description: 'The app as it now stands', examples: [APP_SUMMARY_EXAMPLE] },
)

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
  { description: 'At least one field; an omitted field is unchanged', minProperties: 1, examples: [{ disabled: true }] },
)

export const AppSecretResponse = t.Object(
  {
    appSecret: t.String({ description: 'Shown only in this response; the previous secret no longer works' }),
  },
  { description: 'The new app secret', examples: [{ appSecret: EXAMPLE.appSecret }] },
)

export const AppListResponse = t.Object(
  { apps: t.Array(AppSummary) },
  { description: "The account's apps, newest first", examples: [{ apps: [APP_SUMMARY_EXAMPLE] }] },
)

export const SigningKeyListResponse = t.Object(
  {
    keys: t.Array(
      t.Object({
        keyId,
        publicKey,
        active: t.Boolean({ description: 'True for the key that signs now' }),
        createdAt: t.String({ format: 'date-time' }),
      }),
    ),
  },
  {
    description: "The app's signing keys, newest first",
    examples: [{ keys: [{ keyId: EXAMPLE.keyId, publicKey: EXAMPLE.publicKey, active: true, createdAt: EXAMPLE.createdAt }] }],
  },
)

export const RotatedKeyResponse = t.Object(
  { keyId, publicKey },
  { description: 'The new signing key, active from now on', examples: [{ keyId: EXAMPLE.keyId, publicKey: EXAMPLE.publicKey }] },
)
