import { t } from 'elysia'
import { EXAMPLE } from '../lib/examples'
import { MAX_LIST_ENTRIES } from '../actors/list-append'
import { Chars, StrictBody } from '../lib/model'

export const HWID_LENGTH = { min: 1, max: 128 } as const
/** The spec's 7 to 45; shorter only to name an entry a list shows so (security/service.ts shortIp), which no schema can say. */
export const IP_LENGTH = { min: 7, max: 45 } as const

const hwidEntry = Chars(HWID_LENGTH.min, HWID_LENGTH.max, { description: `An HWID, ${HWID_LENGTH.min} to ${HWID_LENGTH.max} characters` })
const ipEntry = Chars(1, IP_LENGTH.max, {
  description: `A single IPv4/IPv6 address of ${IP_LENGTH.min} to ${IP_LENGTH.max} characters (stored canonical; shorter only to name an entry the list shows so, such as ::1)`,
})
const list = (entry: typeof hwidEntry, description: string) => t.Array(entry, { maxItems: MAX_LIST_ENTRIES, description })

/** Per-app lists checked on every authentication: blacklists always win; a non-empty whitelist admits only its entries. */
export const SecurityConfig = t.Object(
  {
    hwidBlacklist: list(hwidEntry, 'HWIDs blocked'),
    hwidWhitelist: list(hwidEntry, 'When non-empty, only these HWIDs are allowed'),
    ipBlacklist: list(ipEntry, 'IP addresses blocked (canonical form)'),
    ipWhitelist: list(ipEntry, 'When non-empty, only these IP addresses are allowed (canonical form)'),
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

export const SecurityEntryBody = t.Union(
  [
    StrictBody({ type: t.Literal('hwid'), value: hwidEntry }, { examples: [{ type: 'hwid', value: EXAMPLE.otherHwid }] }),
    StrictBody({ type: t.Literal('ip'), value: ipEntry }, { examples: [{ type: 'ip', value: '203.0.113.7' }] }),
  ],
  { description: 'One entry: an HWID or an IP address', examples: [{ type: 'ip', value: '203.0.113.7' }, { type: 'hwid', value: EXAMPLE.otherHwid }] },
)

export type SecurityConfig = typeof SecurityConfig.static
export type PutSecurityBody = typeof PutSecurityBody.static
export type SecurityEntryBody = typeof SecurityEntryBody.static
