/** The ISO 8601 forms parseIsoTimestamp reads, as a request schema's pattern (lib/model.ts Timestamp). */
export const ISO_8601 =
  /^(\d{4})-(\d{2})-(\d{2})(?:[Tt](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d{1,9}))?)?([Zz]|[+-]\d{2}(?::?\d{2})?)?)?$/

const daysInMonth = (year: number, month: number) => new Date(Date.UTC(year, month, 0)).getUTCDate()

/**
 * Parses an ISO 8601 date or date-time. A time without an offset is read as UTC, so the result never
 * depends on the server's time zone; impossible dates (Feb 30, hour 25) are refused, not rolled over.
 */
export function parseIsoTimestamp(text: string): Date | null {
  const m = ISO_8601.exec(text)
  if (!m) return null
  const [, y, mo, d, h = '00', mi = '00', s = '00', frac = '', offset = 'Z'] = m
  const year = Number(y)
  const month = Number(mo)
  const day = Number(d)
  if (month < 1 || month > 12 || day < 1 || day > daysInMonth(year, month)) return null
  if (Number(h) > 23 || Number(mi) > 59 || Number(s) > 59) return null
  let zone = offset.toUpperCase()
  if (zone !== 'Z') {
    const digits = zone.slice(1).replace(':', '')
    const oh = digits.slice(0, 2)
    const om = digits.slice(2) || '00'
    if (Number(oh) > 23 || Number(om) > 59) return null
    zone = `${zone[0]}${oh}:${om}`
  }
  const ms = frac.padEnd(3, '0').slice(0, 3)
  const date = new Date(`${y}-${mo}-${d}T${h}:${mi}:${s}.${ms}${zone}`)
  return Number.isNaN(date.getTime()) ? null : date
}
