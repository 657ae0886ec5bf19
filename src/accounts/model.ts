import { t } from 'elysia'

export const AccountResponse = t.Object({
  accountId: t.String({ format: 'uuid' }),
  name: t.String(),
  credits: t.Integer({ description: 'Credit balance' }),
})
