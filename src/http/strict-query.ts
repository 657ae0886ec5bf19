import { badRequest } from '../lib/errors'

export interface IntegerRange {
  minimum: number
  maximum: number
}

/**
 * A query string checked as sent, before Elysia coerces it: coercion reads `0x10`, `1e1` or ` 1` as
 * numbers, and a name given twice as its last value, where the client may have meant the first.
 * `integers` names the parameters that are integers, with their ranges.
 */
export function checkQuery(url: string, integers: Record<string, IntegerRange>): void {
  const start = url.indexOf('?')
  if (start < 0) return
  const seen = new Set<string>()
  for (const [name, value] of new URLSearchParams(url.slice(start + 1))) {
    if (seen.has(name)) throw badRequest(`${JSON.stringify(name)} is given more than once`)
    seen.add(name)
    // Its own properties only: `constructor` or `__proto__` found Object.prototype's and was checked as
    // an integer of undefined range, not refused as the unknown field it is.
    const range = Object.hasOwn(integers, name) ? integers[name] : undefined
    if (range && !(/^[0-9]{1,16}$/.test(value) && Number(value) >= range.minimum && Number(value) <= range.maximum)) {
      throw badRequest(`${name} must be an integer from ${range.minimum} to ${range.maximum}`)
    }
  }
}
