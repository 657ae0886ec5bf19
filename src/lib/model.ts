import { type StringOptions, Type } from '@sinclair/typebox'
import { t } from 'elysia'
import { ISO_8601 } from './time'

/**
 * Text that PostgreSQL can store: no NUL character (text and JSON columns refuse it) and no unpaired
 * UTF-16 surrogate (it has no UTF-8 form). Every string a request brings in is checked against it, so
 * such input is a 400 at the edge and never reaches a query or a shared batch.
 */
export const STORABLE_TEXT =
  '^[^\\u0000\\uD800-\\uDFFF]*(?:[\\uD800-\\uDBFF][\\uDC00-\\uDFFF][^\\u0000\\uD800-\\uDFFF]*)*$'

/** STORABLE_TEXT as a RegExp: text read outside a schema, and what a validation message says of a refused string. */
export const STORABLE = new RegExp(STORABLE_TEXT)

/** A request string: `t.String` limited to storable text (see STORABLE_TEXT). */
export const Text = (options: StringOptions = {}) => t.String({ ...options, pattern: STORABLE_TEXT })

/** One storable character: a code point, a surrogate pair one (see STORABLE_TEXT). */
export const STORABLE_CHAR = '(?:[^\\u0000\\uD800-\\uDFFF]|[\\uD800-\\uDBFF][\\uDC00-\\uDFFF])'

/**
 * Storable text of `min` to `max` characters as the spec counts them, a character outside the BMP (an
 * emoji) one: TypeBox's minLength and maxLength count UTF-16 code units, two for it. The bounds are in
 * the pattern; `x-characters` names them for the validation message and the document's readers.
 */
export const Chars = (min: number, max: number, options: StringOptions = {}) =>
  t.String({ ...options, pattern: `^${STORABLE_CHAR}{${min},${max}}$`, 'x-characters': [min, max] })

/**
 * An instant in a request: an ISO 8601 date or date-time as parseIsoTimestamp reads it (a time without
 * an offset is UTC). The shape is the schema's; an impossible date (Feb 30) and the range are the
 * service's checks. `x-form` names it for the validation message.
 */
export const Timestamp = (options: StringOptions = {}) =>
  t.String({ ...options, pattern: ISO_8601.source, 'x-form': 'an ISO 8601 timestamp' })

/** How many characters `text` holds as Chars counts them: code points (a string iterates by them). */
export function characters(text: string): number {
  let n = 0
  for (const _ of text) n++
  return n
}

/**
 * A count in a request body or a response: a JSON integer only. TypeBox's own Integer, because Elysia's
 * `t.Integer` also takes numeric text ("0x10", " 3") through a transform, and documents it as a string
 * alternative (right for a query string only).
 */
export const Count = (options: Parameters<typeof Type.Integer>[0] = {}) => Type.Integer(options)

/** A /v1 request body: exactly the documented fields; any other gets 400 naming it. */
export const StrictBody = <T extends Parameters<typeof t.Object>[0]>(
  properties: T,
  options: { description?: string; minProperties?: number; examples?: unknown[] } = {},
) => t.Object(properties, { ...options, additionalProperties: false })

/** The body of a write that has nothing else to say. */
export const OkBody = t.Object({ ok: t.Literal(true) }, { description: 'Done', examples: [{ ok: true }] })
