import type { licenses } from '../db/schema'
import type { Context } from '../context'
import { badRequest } from '../lib/errors'
import { hmacBase64Url, safeEqual } from '../lib/crypto'

/** Where a listing page ended: the last row's position in (created_at DESC, key DESC) order. */
export interface Cursor {
  createdAt: string
  key: string
}

const CURSOR_TEXT = /^([A-Za-z0-9_-]{1,200})\.([A-Za-z0-9_-]{22})$/

// The MAC input is prefixed so a cursor's tag can never stand for a session token's (same key), and
// names the app so a cursor of one listing is refused by another.
const cursorTag = (ctx: Context, appId: string, position: string) =>
  hmacBase64Url(ctx.sessionKey, `license-cursor\n${appId}\n${position}`).slice(0, 22)

/** The last row's position, tagged with a MAC: only a cursor this API returned is ever decoded. */
export function encodeCursor(ctx: Context, row: typeof licenses.$inferSelect): string {
  const position = Buffer.from(`${row.createdAt.toISOString()}|${row.key}`, 'utf8').toString('base64url')
  return `${position}.${cursorTag(ctx, row.appId, position)}`
}

export function decodeCursor(ctx: Context, appId: string, text: string): Cursor {
  const invalid = () => badRequest('cursor is not one this API returned')
  const [, position, tag] = CURSOR_TEXT.exec(text) ?? []
  if (!position || !tag || !safeEqual(tag, cursorTag(ctx, appId, position))) throw invalid()
  const [createdAt, key] = Buffer.from(position, 'base64url').toString('utf8').split('|')
  if (createdAt === undefined || key === undefined) throw invalid()
  return { createdAt, key }
}
