import { t } from 'elysia'
import { EXAMPLE } from '../lib/examples'
import { Chars, Count, StrictBody, Text, Timestamp } from '../lib/model'

/** The instants an expiry may name: what PostgreSQL's timestamptz and a JS Date both hold, in plain ISO 8601. */
const EXPIRY_RANGE_TEXT = 'from 1970-01-01T00:00:00Z to 9999-12-31T23:59:59.999Z (UTC), else 400'

const isoDate = (description: string) => t.String({ format: 'date-time', description })

export const LicenseKeyParams = t.Object({
  licenseKey: Text({
    description: 'License key, XXXX-XXXX-XXXX-XXXX',
    examples: [EXAMPLE.licenseKey],
  }),
})

export const LicenseHwidParams = t.Composite([
  LicenseKeyParams,
  t.Object({
    hwid: Chars(1, 128, { description: 'A bound hardware ID', examples: [EXAMPLE.hwid] }),
  }),
])

const LICENSE_EXAMPLE = {
  licenseKey: EXAMPLE.licenseKey,
  appId: EXAMPLE.appId,
  status: 'active' as const,
  expiresAt: EXAMPLE.expiresAt,
  maxHwidSlots: 2,
  unlimitedHwidSlots: false,
  label: 'Order 10482',
  createdAt: EXAMPLE.createdAt,
}
const WITH_HWIDS_EXAMPLE = { ...LICENSE_EXAMPLE, hwidList: [EXAMPLE.hwid, EXAMPLE.otherHwid] }

/** The seats a license may have (the spec's range); a license record always holds one of them. */
export const HWID_SLOTS = { minimum: 1, maximum: 16 } as const

/** A license as returned by create: everything but the bound HWIDs. */
export const License = t.Object({
  licenseKey: t.String(),
  appId: t.String({ format: 'uuid' }),
  status: t.Union([t.Literal('active'), t.Literal('revoked')]),
  expiresAt: t.Nullable(isoDate('Expiry; null means lifetime')),
  maxHwidSlots: Count(HWID_SLOTS),
  unlimitedHwidSlots: t.Boolean({
    description: 'Shared unlimited-seat key: seat enforcement is skipped',
  }),
  label: t.Nullable(Chars(0, 128)),
  createdAt: isoDate('Creation time, with milliseconds'),
}, { examples: [LICENSE_EXAMPLE] })

/** A license with its bound HWIDs, as list and update return it. */
export const LicenseWithHwids = t.Composite([
  License,
  t.Object({
    hwidList: t.Array(t.String(), { description: 'Bound hardware IDs, oldest binding first' }),
  }),
], { examples: [WITH_HWIDS_EXAMPLE] })

/** The single-license view: adds `hwid`, the first (oldest) bound HWID or null. */
export const LicenseDetail = t.Composite([
  LicenseWithHwids,
  t.Object({
    hwid: t.Nullable(t.String({ description: 'The first bound HWID, or null when none is bound' })),
  }),
], { description: 'The license with its bound HWIDs', examples: [{ ...WITH_HWIDS_EXAMPLE, hwid: EXAMPLE.hwid }] })

export const CreateLicensesBody = StrictBody({
  appId: Text({ description: 'Application to issue for', examples: [EXAMPLE.appId] }),
  quantity: t.Optional(Count({ minimum: 1, maximum: 100, default: 1 })),
  expiresAt: t.Optional(
    t.Nullable(Timestamp({ description: `ISO 8601; null (or omitted) for lifetime; ${EXPIRY_RANGE_TEXT}` })),
  ),
  maxHwidSlots: t.Optional(
    Count({
      default: 1,
      description: `${HWID_SLOTS.minimum} to ${HWID_SLOTS.maximum}; ignored when unlimitedHwidSlots is true (any integer taken, one outside that range recorded as 1)`,
    }),
  ),
  unlimitedHwidSlots: t.Optional(t.Boolean({ default: false })),
  label: t.Optional(Chars(0, 128)),
}, {
  examples: [
    { appId: EXAMPLE.appId, quantity: 1, expiresAt: EXAMPLE.expiresAt, maxHwidSlots: 2, label: 'Order 10482' },
  ],
})

export const CreateLicensesResponse = t.Object(
  { licenses: t.Array(License) },
  { description: 'The new licenses, all active', examples: [{ licenses: [LICENSE_EXAMPLE] }] },
)

/** A page's size: checked as sent (http/strict-query.ts) as well as by the schema, which documents it. */
export const LIST_LIMIT = { minimum: 1, maximum: 200 }

export const ListLicensesQuery = t.Object({
  appId: Text({ description: 'Application whose licenses to list', examples: [EXAMPLE.appId] }),
  limit: t.Optional(t.Integer({ ...LIST_LIMIT, default: 50 })),
  cursor: t.Optional(
    Text({ description: 'The cursor of the previous page, as returned; any other value gets 400' }),
  ),
})

export const ListLicensesResponse = t.Object({
  licenses: t.Array(LicenseWithHwids),
  cursor: t.Nullable(
    t.String({ description: 'Pass back for the next page; null on the last page' }),
  ),
}, {
  description: 'One page of licenses, newest first',
  examples: [{ licenses: [WITH_HWIDS_EXAMPLE], cursor: null }],
})

export const UpdateLicenseBody = t.Union([
  StrictBody({
    action: t.Literal('extend'),
    expiresAt: t.Nullable(Timestamp({ description: `ISO 8601 new expiry (null: lifetime); ${EXPIRY_RANGE_TEXT}` })),
  }, { examples: [{ action: 'extend', expiresAt: EXAMPLE.expiresAt }] }),
  StrictBody({
    action: t.Union([t.Literal('revoke'), t.Literal('activate'), t.Literal('reset-hwid')]),
  }, { examples: [{ action: 'revoke' }] }),
], {
  description: 'extend takes a new expiry, required; the other actions take nothing else',
  examples: [{ action: 'extend', expiresAt: EXAMPLE.expiresAt }, { action: 'revoke' }],
})

export const UpdateLicenseResponse = t.Object(
  { ok: t.Literal(true), license: LicenseWithHwids },
  { description: 'The license as it now stands', examples: [{ ok: true, license: WITH_HWIDS_EXAMPLE }] },
)

export type License = typeof License.static
export type LicenseWithHwids = typeof LicenseWithHwids.static
export type LicenseDetail = typeof LicenseDetail.static
export type CreateLicensesBody = typeof CreateLicensesBody.static
export type ListLicensesQuery = typeof ListLicensesQuery.static
export type ListLicensesResponse = typeof ListLicensesResponse.static
export type UpdateLicenseBody = typeof UpdateLicenseBody.static
export type UpdateLicenseResponse = typeof UpdateLicenseResponse.static
