import { t } from 'elysia'
import { EXAMPLE } from '../../lib/examples'
import { Chars, StrictBody, Text, Timestamp } from '../../lib/model'
import { requestChecksum } from './request'

const isoDate = (description: string) => t.String({ format: 'date-time', description })
const HWID_EXAMPLE = EXAMPLE.hwid

/** The machines a file verifies on, as its payload's `hwid` says. */
export const OfflineHwid = t.Union(
  [
    t.Object({
      mode: t.Literal('bound'),
      hwids: t.Array(t.String(), { description: 'The HWIDs the file verifies on', examples: [[HWID_EXAMPLE]] }),
    }),
    t.Object({ mode: t.Literal('any') }),
  ],
  { description: 'bound: only on the listed machines; any: on every machine (unlimited-seat licenses)' },
)

const FileExpiry = t.Optional(
  t.Nullable(
    Timestamp({
      description:
        "ISO 8601 expiry of the file, in the future and not after the license's own (else 400); null: never " +
        "(only for a license that never expires); omitted: the license's expiry",
      examples: ['2027-01-01T00:00:00.000Z'],
    }),
  ),
)

export const MintOfflineFileBody = StrictBody({
  hwids: t.Optional(
    t.Array(Chars(1, 128, { examples: [HWID_EXAMPLE] }), {
      minItems: 1,
      maxItems: 16,
      description:
        '1 to 16 HWIDs (1 to 128 characters each, neither beginning nor ending with white space: the SDKs ' +
        'trim the machine\'s HWID before comparing) the file is bound to; each one not yet bound takes a free ' +
        "seat first (409 seats_full when there are too few, and then none is bound). Omitted: the license's " +
        'bound HWIDs (400 when none is bound).',
      examples: [[HWID_EXAMPLE]],
    }),
  ),
  anyMachine: t.Optional(
    t.Boolean({
      description: 'true: the file verifies on any machine; only for unlimited-seat licenses (else 400), not with hwids',
      examples: [false],
    }),
  ),
  expiresAt: FileExpiry,
}, { examples: [{ hwids: [HWID_EXAMPLE], expiresAt: '2027-01-01T00:00:00.000Z' }] })

/** A request as AuthForge's SDKs write one for the example machine (the conformance vectors' layout). */
const REQUEST_EXAMPLE = (() => {
  const payload = Buffer.from(
    JSON.stringify({
      v: 1,
      typ: 'authforge-activation-request',
      appId: EXAMPLE.appId,
      hwid: EXAMPLE.hwid,
      createdAt: EXAMPLE.createdAt,
      machineName: 'acme-ws-07',
      os: 'Windows 11',
      sdk: 'python/1.2.1',
      licenseKey: EXAMPLE.licenseKey,
    }),
  ).toString('base64')
  const lines = payload.match(/.{1,64}/g)!.join('\n')
  return (
    `-----BEGIN AUTHFORGE ACTIVATION REQUEST-----\nVersion: 1\nApp-Id: ${EXAMPLE.appId}\nChecksum: ${requestChecksum(payload)}\n\n` +
    `${lines}\n-----END AUTHFORGE ACTIVATION REQUEST-----\n`
  )
})()

/** An activation request as the SDK wrote it: sent as is (text/plain) or in JSON with the mint's options. */
export const ActivationRequestBody = t.Union([
  Text({
    description: 'text/plain: the `.authforge-request` text, e-mail text around it allowed',
    examples: [REQUEST_EXAMPLE],
  }),
  StrictBody(
    {
      request: Text({ description: 'The `.authforge-request` text', examples: [REQUEST_EXAMPLE] }),
      licenseKey: t.Optional(
        Text({
          description:
            "The license to bind the machine to; without it, the one the request names. The request's key is the customer's to write (its checksum is no signature), so this one wins.",
          examples: [EXAMPLE.licenseKey],
        }),
      ),
      expiresAt: FileExpiry,
    },
    { description: 'application/json: the request text with the optional license key and file expiry' },
  ),
], { examples: [{ request: REQUEST_EXAMPLE, licenseKey: EXAMPLE.licenseKey }] })

/** A minted file as the listing shows it: the text itself is not kept. */
export const OfflineFileSummary = t.Object({
  fileId: t.String({ format: 'uuid', description: "The file's id, its payload's jti" }),
  keyId: t.String({ description: 'The signing key that signed it', examples: [EXAMPLE.keyId] }),
  issuedAt: isoDate('When it was minted'),
  expiresAt: t.Nullable(isoDate('When it stops verifying; null: never')),
  hwid: OfflineHwid,
})

const FILE_EXAMPLE = {
  fileId: EXAMPLE.fileId,
  keyId: EXAMPLE.keyId,
  issuedAt: EXAMPLE.createdAt,
  expiresAt: '2027-01-01T00:00:00.000Z',
  hwid: { mode: 'bound' as const, hwids: [HWID_EXAMPLE] },
}

export const OfflineFile = t.Composite(
  [
    t.Object({
      fileId: t.String({ format: 'uuid', description: "The file's id, its payload's jti" }),
      licenseKey: t.String({ examples: [EXAMPLE.licenseKey] }),
      appId: t.String({ format: 'uuid' }),
    }),
    t.Omit(OfflineFileSummary, ['fileId']),
    t.Object({
      file: t.String({
        description: 'The armored .authforge text to hand to the customer (Ed25519-signed; verified offline by the SDKs)',
      }),
    }),
  ],
  {
    description: 'The minted file and what it says',
    examples: [
      {
        ...FILE_EXAMPLE,
        licenseKey: EXAMPLE.licenseKey,
        appId: EXAMPLE.appId,
        file: '-----BEGIN AUTHFORGE LICENSE-----\nVersion: 1\n…\n-----END AUTHFORGE SIGNATURE-----\n',
      },
    ],
  },
)

export const OfflineFileList = t.Object(
  { files: t.Array(OfflineFileSummary) },
  { description: 'The files minted for the license, newest first', examples: [{ files: [FILE_EXAMPLE] }] },
)

export type MintOfflineFileBody = typeof MintOfflineFileBody.static
export type ActivationRequestBody = typeof ActivationRequestBody.static
export type OfflineFileSummary = typeof OfflineFileSummary.static
export type OfflineFile = typeof OfflineFile.static
export type OfflineFileList = typeof OfflineFileList.static
