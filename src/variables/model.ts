import { t } from 'elysia'
import { EXAMPLE } from '../lib/examples'
import { Text } from '../lib/model'

/** A flat variable map: 1 to 64 character names, scalar values, at most 50 names and 4,096 bytes of JSON. */
export const VariableMapBody = t.Record(
  Text({ minLength: 1, maxLength: 64 }),
  t.Union([Text(), t.Number(), t.Boolean()]),
  {
    description: 'Flat map of variables; string, number or boolean values',
    examples: [EXAMPLE.variables],
  },
)
