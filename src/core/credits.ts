import type { Deps } from '../deps'
import { currentBalance } from './credits-ledger'

/**
 * Whether the account may create licenses: the contract asks for a positive balance and spends
 * nothing. Reads the live balance the client endpoints spend from (the reconciled one trails it).
 */
export async function hasPositiveBalance(deps: Deps, accountId: string): Promise<boolean> {
  return (await currentBalance(deps, accountId)) > 0
}
