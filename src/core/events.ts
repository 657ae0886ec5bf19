import type { DbOrTx } from '../db/client'
import { events } from '../db/schema'

/** The subscribable event names (test.ping is sent by the test operation only). */
export const EVENT_NAMES = [
  'license.validated',
  'license.created',
  'license.revoked',
  'license.activated',
  'license.hwid_bound',
  'license.hwid_reset',
  'license.deleted',
] as const
export type EventName = (typeof EVENT_NAMES)[number]

export interface EventData extends Record<string, unknown> {
  licenseKey: string
  appId: string
}

export interface DomainEvent {
  event: EventName
  data: EventData
  occurredAt: Date
}

/**
 * Writes events to the outbox inside the caller's transaction, so an event exists exactly when the
 * change that caused it committed. Delivery reads the outbox; call `EventBus.notify()` after commit.
 */
export async function recordEvents(tx: DbOrTx, list: readonly DomainEvent[]): Promise<void> {
  if (list.length === 0) return
  await tx.insert(events).values(
    list.map((e) => ({ appId: e.data.appId, event: e.event, data: e.data, occurredAt: e.occurredAt })),
  )
}

/** Wakes in-process consumers of the outbox (the webhook dispatcher) right after a commit. */
export class EventBus {
  readonly #listeners = new Set<() => void>()

  subscribe(listener: () => void): () => void {
    this.#listeners.add(listener)
    return () => this.#listeners.delete(listener)
  }

  notify(): void {
    for (const listener of this.#listeners) listener()
  }
}
