import { randomUUID } from 'node:crypto'
import { eq, sql } from 'drizzle-orm'
import { accounts, creditFlushes } from '../db/schema'
import type { Deps } from '../deps'
import { errorFields, log } from '../log'
import { keys } from '../store/store'

/**
 * Credits on the hot path live in the store: charges take from a live balance there atomically (never
 * below zero, shared by every instance) and count as pending; a reconciler moves pending charges into
 * accounts.credits off the request path. Each flush carries an id recorded in credit_flushes in the same
 * transaction as the subtraction, so a flush retried after a crash is applied once.
 */

/** Seeds the live balance from PostgreSQL; retried when addCredits commits in between. */
export async function loadLiveBalance(deps: Deps, accountId: string): Promise<void> {
  for (let attempt = 0; attempt < 5; attempt++) {
    const [epoch = 0] = await deps.store.epochs([keys.accountEpoch(accountId)])
    const [row] = await deps.database.db
      .select({ credits: accounts.credits })
      .from(accounts)
      .where(eq(accounts.id, accountId))
      .limit(1)
    if ((await deps.store.loadBalance(accountId, epoch, row?.credits ?? 0)) === 'ok') return
  }
  throw new Error('account credits kept changing while loading the live balance')
}

/** The balance a caller may spend now: the live one when loaded, else the reconciled one. */
export async function currentBalance(deps: Deps, accountId: string): Promise<number> {
  const live = await deps.store.balance(accountId)
  if (live !== null) return live
  const [row] = await deps.database.db
    .select({ credits: accounts.credits })
    .from(accounts)
    .where(eq(accounts.id, accountId))
    .limit(1)
  return row?.credits ?? 0
}

/**
 * One reconciliation pass over every account with pending charges. One account's failure is logged
 * and retried next pass without holding up the others; charges of a deleted account are dropped.
 */
export async function flushCredits(deps: Deps): Promise<void> {
  for (const accountId of await deps.store.dirtyAccounts()) {
    try {
      await flushAccount(deps, accountId)
    } catch (err) {
      log.warn('credit flush failed for an account; will retry', { accountId, ...errorFields(err) })
    }
  }
}

async function flushAccount(deps: Deps, accountId: string): Promise<void> {
  const flush = await deps.store.beginFlush(accountId, randomUUID())
  if (flush) {
    await deps.database.db.transaction(async (tx) => {
      // The row lock also orders this flush against addCredits on the same account.
      const [account] = await tx.select({ id: accounts.id }).from(accounts).where(eq(accounts.id, accountId)).for('update')
      if (!account) return
      const inserted = await tx
        .insert(creditFlushes)
        .values({ id: flush.id, accountId, amount: flush.amount })
        .onConflictDoNothing()
        .returning({ id: creditFlushes.id })
      if (inserted.length === 0) return
      await tx
        .update(accounts)
        .set({ credits: sql`GREATEST(0, ${accounts.credits} - ${flush.amount})` })
        .where(eq(accounts.id, accountId))
    })
  }
  await deps.store.endFlush(accountId, flush?.id ?? '')
}

/** Runs flushCredits every `intervalMs` until stopped; stop() runs a last pass. */
export function startCreditReconciler(deps: Deps, intervalMs = 1000): { stop(): Promise<void> } {
  let running: Promise<void> = Promise.resolve()
  const pass = () => {
    running = running.then(() =>
      flushCredits(deps).catch((err) => log.warn('credit reconciliation failed; will retry', errorFields(err))),
    )
    return running
  }
  const timer = setInterval(pass, intervalMs)
  timer.unref?.()
  return {
    async stop() {
      clearInterval(timer)
      await pass()
    },
  }
}
