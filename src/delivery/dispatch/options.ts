import type { Db } from '../../db/client'
import type { DeliveryJob, DeliveryResult, Withdrawn } from '../protocol'
import { DELIVERY_FETCHES } from '../fetch-limit'

export interface DispatcherOptions {
  /** How often to look for work from other instances (and missed wake-ups). */
  pollMs?: number
  /**
   * A claim older than this is taken over: its instance stopped renewing it (Recorder.renew, four
   * times a lease), as after a crash, or could not reach the database for that long.
   */
  leaseSeconds?: number
  /** Most events fanned out per statement (fewer when fewer slots are free). */
  fanOutBatch?: number
  /** Deliveries this instance has on the workers at once: at most 256, and within what Bun lets a process fetch (fetch-limit.ts). */
  maxInFlight?: number
  /**
   * Deliveries of one account on the way that are claimed before others' waiting past their share
   * (Room in claim.ts). By default an eighth of maxInFlight: it takes several accounts whose
   * receivers hang, each with a backlog, to fill the slots.
   */
  perAccountShare?: number
  /**
   * Least time between two passes. Writers wake the dispatcher after every commit (validate's batch
   * every few ms); coalescing wake-ups keeps the database work per event small under load.
   */
  minGapMs?: number
  /** Dispatched events whose deliveries are all attempted are deleted after this many days. */
  retentionDays?: number
  /**
   * Host CPU share (0–1) of non-background work from which deliveries give way, when the API thread
   * is busy too (yieldApiAbove): then commits no longer wake the dispatcher and only the poll fans
   * out and claims (up to maxInFlight per pollMs), so API requests keep the CPU and the database; the
   * events wait undispatched in PostgreSQL and are sent when the load drops. Above 1 turns this off.
   */
  yieldAbove?: number
  /** The API thread's share of one CPU (0–1) from which it counts as busy; see yieldAbove. */
  yieldApiAbove?: number
}

/** The options with their defaults filled in. */
export type DispatcherSettings = Required<DispatcherOptions>

export function dispatcherSettings(options: DispatcherOptions): DispatcherSettings {
  const maxInFlight = options.maxInFlight ?? Math.min(256, DELIVERY_FETCHES)
  return {
    pollMs: options.pollMs ?? 1_000,
    leaseSeconds: options.leaseSeconds ?? 120,
    fanOutBatch: options.fanOutBatch ?? 500,
    maxInFlight,
    perAccountShare: options.perAccountShare ?? Math.max(1, Math.floor(maxInFlight / 8)),
    minGapMs: options.minGapMs ?? 50,
    retentionDays: options.retentionDays ?? 7,
    yieldAbove: options.yieldAbove ?? 0.7,
    yieldApiAbove: options.yieldApiAbove ?? 0.25,
  }
}

/** What the dispatcher runs on: the main thread's (PGlite) or a delivery worker's own (PostgreSQL). */
export interface DispatcherContext {
  db: Db
  /** Sends one prepared delivery; never rejects. */
  send(job: DeliveryJob): Promise<DeliveryResult>
  /** Answers the deliveries still queued (not sent) with reason 'cancelled': every one, or those `withdrawn` names. */
  cancelQueued(withdrawn?: Withdrawn | null): void
  /** Opens a sealed webhook secret; throws when it cannot be opened. */
  openSecret(sealed: string): Promise<string>
  /** Calls the listener after every commit that wrote events; returns the unsubscribe. */
  onCommit(listener: () => void): () => void
  /** Outcomes of the attempts of one recorded batch (see deliveryOutcome), counted by the main thread's metrics. */
  recorded(outcomes: Record<string, number>): void
  clock: () => number
}

/** A recorded attempt's outcome, as webhook_deliveries_total labels it. */
export function deliveryOutcome(status: number | null): string {
  if (status === null) return 'skipped'
  if (status === 0) return 'no_response'
  return status >= 200 && status < 300 ? 'success' : 'http_error'
}

/** A started dispatcher, in this thread or in a delivery worker. */
export interface RunningDispatcher {
  /** Stops taking work, then waits for deliveries on the way and records their results. */
  stop(): Promise<void>
  [Symbol.asyncDispose](): Promise<void>
}
