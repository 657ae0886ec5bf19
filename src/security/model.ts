import { t } from 'elysia'
import { EXAMPLE } from '../lib/examples'
import { StrictBody, Text } from '../lib/model'

const list = (description: string) => t.Array(Text(), { maxItems: 1000, description })

/** Per-app lists checked on every authentication: blacklists always win; a non-empty whitelist admits only its entries. */
export const SecurityConfig = t.Object(
  {
    hwidBlacklist: list('HWIDs blocked'),
    hwidWhitelist: list('When non-empty, only these HWIDs are allowed'),
    ipBlacklist: list('IP addresses blocked (canonical form)'),
    ipWhitelist: list('When non-empty, only these IP addresses are allowed (canonical form)'),
  },
  {
    description: "The app's lists as they now stand",
    examples: [{ hwidBlacklist: [EXAMPLE.otherHwid], hwidWhitelist: [], ipBlacklist: ['203.0.113.7', '2001:db8::1'], ipWhitelist: [] }],
  },
)

export const PutSecurityBody = t.Partial(SecurityConfig, {
  additionalProperties: false,
  description:
    'A supplied list replaces that list (entries deduplicated, order kept); omitted lists are unchanged; [] clears',
  examples: [{ ipBlacklist: ['203.0.113.7', '2001:db8::1'], hwidWhitelist: [] }],
})

export const SecurityEntryBody = StrictBody(
  {
    type: t.Union([t.Literal('hwid'), t.Literal('ip')]),
    value: Text({
      description:
        'HWID of 1 to 128 characters, or a single IPv4/IPv6 address of 7 to 45 characters (stored canonical; shorter only to name an entry the list shows so, such as ::1)',
    }),
  },
  { examples: [{ type: 'ip', value: '203.0.113.7' }, { type: 'hwid', value: EXAMPLE.otherHwid }] },
)

export type SecurityConfig = typeof SecurityConfig.static
export type PutSecurityBody = typeof PutSecurityBody.static
export type SecurityEntryBody = typeof SecurityEntryBody.static
