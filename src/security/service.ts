import { isIP } from 'node:net'
import { and, eq, sql } from 'drizzle-orm'
import type { PgUpdateSetSource } from 'drizzle-orm/pg-core'
import { apps } from '../db/schema'
import type { Context } from '../context'
import { badRequest } from '../lib/errors'
import { canonicalIp } from '../lib/ip'
import { requireOwnedApp } from '../apps/service'
import { appendEntry, type ListName, MAX_LIST_ENTRIES } from '../actors/list-append'
import { IP_LENGTH, type PutSecurityBody, type SecurityConfig, type SecurityEntryBody } from './model'

type EntryType = SecurityEntryBody['type']
export type ListKind = 'blacklist' | 'whitelist'

const ENTRY_TYPES = {
  hwidBlacklist: 'hwid',
  hwidWhitelist: 'hwid',
  ipBlacklist: 'ip',
  ipWhitelist: 'ip',
} as const satisfies Record<ListName, EntryType>

const LIST_NAMES = Object.keys(ENTRY_TYPES) as ListName[]

const listName = (type: EntryType, kind: ListKind): ListName =>
  `${type}${kind === 'blacklist' ? 'Blacklist' : 'Whitelist'}`

/**
 * The stored form of an entry (its lengths are the schema's), or 400. IPs are single addresses kept
 * canonical (IPv4-mapped IPv6 is the IPv4 address) because the authentication path compares canonical text.
 */
function normalizeEntry(type: EntryType, value: string): string {
  if (type === 'hwid') return value
  // Zone IDs (fe80::1%eth0) name an interface of one host: meaningless for a remote caller.
  const canonical = isIP(value) !== 0 && !value.includes('%') ? canonicalIp(value) : null
  // Shorter than the spec's 7 characters only as the lists show an entry (see shortIp).
  if (value.length < IP_LENGTH.min && canonical !== value) throw ipLength()
  if (canonical === null) throw badRequest(`"${value}" is not an IPv4 or IPv6 address`)
  return canonical
}

const ipLength = () => badRequest(`An IP entry is ${IP_LENGTH.min} to ${IP_LENGTH.max} characters`)

/**
 * An IP entry given shorter than the spec's 7 characters, as the lists show a few IPv6 addresses
 * (0:0:0:0:0:0:0:1 is kept as ::1, as is a selfban from ::1): taken only where it names an entry
 * already there, so what a GET lists can be removed by DELETE and sent back in a PUT, and nothing new
 * under 7 characters is added.
 */
const shortIp = (type: EntryType, value: string) => type === 'ip' && value.length < IP_LENGTH.min

function normalizeList(name: ListName, values: readonly string[]): string[] {
  return [...new Set(values.map((v) => normalizeEntry(ENTRY_TYPES[name], v)))]
}

const selection = {
  hwidBlacklist: apps.hwidBlacklist,
  hwidWhitelist: apps.hwidWhitelist,
  ipBlacklist: apps.ipBlacklist,
  ipWhitelist: apps.ipWhitelist,
}

export async function getSecurity(
  ctx: Context,
  accountId: string,
  appId: string,
): Promise<SecurityConfig> {
  const app = await requireOwnedApp(ctx, accountId, appId)
  return {
    hwidBlacklist: app.hwidBlacklist,
    hwidWhitelist: app.hwidWhitelist,
    ipBlacklist: app.ipBlacklist,
    ipWhitelist: app.ipWhitelist,
  }
}

/** Replaces the supplied lists (deduplicated, order kept) in one UPDATE; omitted lists stay. */
export async function putSecurity(
  ctx: Context,
  accountId: string,
  appId: string,
  input: PutSecurityBody,
): Promise<SecurityConfig> {
  const set: PgUpdateSetSource<typeof apps> = {}
  for (const name of LIST_NAMES) {
    const values = input[name]
    if (values !== undefined) set[name] = normalizeList(name, values)
  }
  const app = await requireOwnedApp(ctx, accountId, appId)
  if (Object.keys(set).length === 0) return getSecurity(ctx, accountId, app.id)
  const row = await ctx.actors.write(
    app.id,
    async (tx) => {
      // A short IP is checked against the lists under the row's lock: checked against a read before it,
      // an entry another instance removed in between was put back, and its DELETE answered 200 undone.
      const [locked] = await tx.select(selection).from(apps).where(eq(apps.id, app.id)).for('update')
      if (!locked) return null
      if (LIST_NAMES.some((name) => input[name]?.some((value) => shortIp(ENTRY_TYPES[name], value) && !locked[name].includes(value)))) {
        return 'short'
      }
      const [updated] = await tx
        .update(apps)
        .set(set)
        .where(and(eq(apps.id, app.id), eq(apps.accountId, accountId)))
        .returning(selection)
      return updated ?? null
    },
    (updated) => ({ app: typeof updated === 'object' && updated !== null }),
  )
  if (row === 'short') throw ipLength()
  if (!row) throw new Error('owned app vanished during update')
  return row
}

/** The list an entry request names, its stored form and the owned app: 400, 403 or 404 otherwise. */
async function entryOf(ctx: Context, accountId: string, appId: string, kind: ListKind, input: SecurityEntryBody) {
  const name = listName(input.type, kind)
  const value = normalizeEntry(input.type, input.value)
  return { name, value, app: await requireOwnedApp(ctx, accountId, appId) }
}

/** Adds one entry (see appendEntry); an entry already present is a no-op success, a full list 400. */
export async function addEntry(ctx: Context, accountId: string, appId: string, kind: ListKind, input: SecurityEntryBody) {
  const { name, value, app } = await entryOf(ctx, accountId, appId, kind, input)
  const outcome = await ctx.actors.write(
    app.id,
    async (tx) => {
      // Read under the row's lock: decided from a read after the append, an entry another instance
      // removed in between made a list of one entry answer "full".
      const [locked] = await tx.select({ list: apps[name] }).from(apps).where(eq(apps.id, app.id)).for('update')
      if (!locked || locked.list.includes(value)) return 'present'
      if (shortIp(input.type, input.value)) return 'short'
      if (locked.list.length >= MAX_LIST_ENTRIES) return 'full'
      return (await appendEntry(tx, app.id, name, value)) ? 'added' : 'full'
    },
    (result) => ({ app: result === 'added' }),
  )
  if (outcome === 'short') throw ipLength()
  if (outcome === 'full') throw badRequest(`${name} already holds ${MAX_LIST_ENTRIES} entries`)
  return { ok: true as const }
}

/** Removes one entry in a single UPDATE; removing an absent entry is a no-op success. */
export async function removeEntry(ctx: Context, accountId: string, appId: string, kind: ListKind, input: SecurityEntryBody) {
  const { name, value, app } = await entryOf(ctx, accountId, appId, kind, input)
  const column = apps[name]
  await ctx.actors.write(
    app.id,
    (tx) =>
      tx
        .update(apps)
        .set({ [name]: sql`array_remove(${column}, ${value}::text)` })
        .where(and(eq(apps.id, app.id), sql`${value}::text = ANY(${column})`))
        .returning({ id: apps.id }),
    (removed) => ({ app: removed.length > 0 }),
  )
  return { ok: true as const }
}
