import { t } from 'elysia'
import { EXAMPLE } from '../lib/examples'
import { Chars, Text } from '../lib/model'

export const MAX_VARIABLES = 50
export const MAX_VARIABLE_NAME_LENGTH = 64
/** Not a schema keyword: the service checks it (variables/service.ts). */
export const MAX_VARIABLES_BYTES = 4096

const name = Chars(1, MAX_VARIABLE_NAME_LENGTH)

/**
 * A flat variable map: 1 to 64 character names, scalar values, at most 50 names and 4,096 bytes of JSON.
 * The names' pattern is what validation checks; propertyNames says the same to the document's readers
 * and its validators.
 */
export const VariableMapBody = t.Record(name, t.Union([Text(), t.Number(), t.Boolean()]), {
  additionalProperties: false,
  propertyNames: name,
  maxProperties: MAX_VARIABLES,
  description: `Flat map of variables; string, number or boolean values; at most ${MAX_VARIABLES_BYTES} bytes of JSON`,
  examples: [EXAMPLE.variables],
})
