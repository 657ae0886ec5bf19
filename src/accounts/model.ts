import { t } from 'elysia'
import { EXAMPLE } from '../lib/examples'
import { Count } from '../lib/model'

export const AccountResponse = t.Object(
  {
    accountId: t.String({ format: 'uuid' }),
    name: t.String(),
    credits: Count({ description: 'Credit balance' }),
  },
  {
    description: 'The account of the API key and its credit balance',
    examples: [{ accountId: EXAMPLE.accountId, name: 'Acme', credits: 1000 }],
  },
)
