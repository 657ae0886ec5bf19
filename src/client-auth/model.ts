import { Type } from '@sinclair/typebox'
import { t } from 'elysia'
import { EXAMPLE } from '../lib/examples'
import { Chars, Text } from '../lib/model'
import { SignedPayload, SignedResponse } from '../signing/model'

/** The longest app id a client request may name. */
export const APP_ID_MAX_LENGTH = 64
const appId = Text({ minLength: 1, maxLength: APP_ID_MAX_LENGTH, description: 'The application id (UUID)' })
const hwid = Chars(1, 128, { description: 'Hardware id of the device, 1 to 128 characters' })
const appSecret = Text({ minLength: 1, maxLength: 256, description: 'The app secret' })
const licenseKey = Text({ minLength: 1, maxLength: 64, description: 'XXXX-XXXX-XXXX-XXXX' })
const nonce = Text({
  minLength: 8,
  maxLength: 128,
  description: 'Fresh random value, 8 to 128 characters; accepted once per app for 7 days (the longest session)',
})
const sessionToken = Text({ minLength: 1, maxLength: 2048, description: 'From a previous validate or heartbeat' })

// Client SDKs add fields over time: /auth bodies take unknown fields, and check only the known ones.
const tolerant = { additionalProperties: true }

export const ValidateBody = t.Object({
  appId,
  appSecret,
  licenseKey,
  hwid,
  nonce,
  // TypeBox's own Integer: Elysia's t.Integer also takes numeric strings through a transform that
  // costs every validate ~1 µs to decode, and a JSON client sends a number.
  ttlSeconds: t.Optional(
    Type.Integer({ description: 'Requested session lifetime; clamped to [3600, 604800]. Default SESSION_TTL_SECONDS.' }),
  ),
}, {
  ...tolerant,
  examples: [
    {
      appId: EXAMPLE.appId,
      appSecret: EXAMPLE.appSecret,
      licenseKey: EXAMPLE.licenseKey,
      hwid: EXAMPLE.hwid,
      nonce: 'c1d4e7a09b3f4e12',
    },
  ],
})

export const HeartbeatBody = t.Object({
  appId,
  sessionToken,
  hwid,
  nonce: t.Optional(Text({ minLength: 1, maxLength: 128, description: 'Echoed in the signed payload; not enforced' })),
}, {
  ...tolerant,
  examples: [{ appId: EXAMPLE.appId, sessionToken: SignedPayload.examples[0].sessionToken, hwid: EXAMPLE.hwid, nonce: '5e0b9f27d3a14c86' }],
})

const selfbanChoices = {
  revokeLicense: t.Optional(t.Boolean({ description: 'Default false pre-session (true fails), true post-session' })),
  blacklistHwid: t.Optional(t.Boolean({ description: 'Default true' })),
  blacklistIp: t.Optional(t.Boolean({ description: 'Default true' })),
}

/** Post-session with a session token (revokes by default), else pre-session with the app secret, key and a nonce. */
export const SelfbanBody = t.Union([
  t.Object({
    appId,
    hwid,
    sessionToken,
    appSecret: t.Optional(appSecret),
    licenseKey: t.Optional(licenseKey),
    nonce: t.Optional(nonce),
    ...selfbanChoices,
  }, { ...tolerant, description: 'Post-session: the session token names the license' }),
  t.Object({
    appId,
    hwid,
    appSecret,
    licenseKey,
    nonce,
    sessionToken: t.Optional(sessionToken),
    ...selfbanChoices,
  }, { ...tolerant, description: 'Pre-session: never revokes' }),
], {
  description: 'A session token (post-session), or the app secret, license key and a nonce (pre-session)',
  examples: [{ appId: EXAMPLE.appId, hwid: EXAMPLE.hwid, sessionToken: SignedPayload.examples[0].sessionToken }],
})

export { SignedPayload, SignedResponse }

export const SelfbanResponse = t.Object({
  status: t.Literal('success'),
  mode: t.Union([t.Literal('pre_session'), t.Literal('post_session')]),
  performed: t.Object({ revokeLicense: t.Boolean(), blacklistHwid: t.Boolean(), blacklistIp: t.Boolean() }),
}, {
  description: 'Reported; `performed` lists the changes this call made',
  examples: [
    { status: 'success', mode: 'post_session', performed: { revokeLicense: true, blacklistHwid: true, blacklistIp: true } },
  ],
})

export type ValidateInput = typeof ValidateBody.static
export type HeartbeatInput = typeof HeartbeatBody.static
export type SelfbanInput = typeof SelfbanBody.static
export type SignedReply = typeof SignedResponse.static
export type SelfbanReply = typeof SelfbanResponse.static
