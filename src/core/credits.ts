import { eq } from 'drizzle-orm'
import { accounts } from '../db/schema'
import type { Deps } from '../deps'

/**
 * Whether the account may create licenses: the contract asks for a positive balance and spends
 * nothing. Reads the reconciled balance in accounts.credits.
 */
export async function hasPositiveBalance(deps: Deps, accountId: string): Promise<boolean> {
  const [row] = await deps.database.db
    .select({ credits: accounts.credits })
    .from(accounts)
    .where(eq(accounts.id, accountId))
    .limit(1)
  return (row?.credits ?? 0) > 0
}
