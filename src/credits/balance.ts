import type { Context } from '../context'

/**
 * Whether the account may create licenses: the contract asks for a positive balance and spends
 * nothing. Reads the live balance the client endpoints spend from (the reconciled one trails it).
 */
export async function hasPositiveBalance(ctx: Context, accountId: string): Promise<boolean> {
  return (await ctx.credits.currentBalance(accountId)) > 0
}
