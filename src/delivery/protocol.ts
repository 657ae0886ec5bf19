/** Messages between the delivery pool (main thread) and its workers. */

export interface WorkerInit {
  type: 'init'
  allowPrivate: boolean
  /** Trusted CAs for deliveries (the system roots plus NODE_EXTRA_CA_CERTS), or null for the defaults. */
  ca: string[] | null
  timeoutMs: number
  /** Requests a worker has open at once; more wait in its queue. */
  concurrency: number
  /** Of those, at most this many to one host (host:port): a receiver that hangs holds no more. */
  perHost: number
  /** Run delivery threads at the lowest CPU priority (the server; not tests sharing a process). */
  lowPriority: boolean
}

/** One signed POST, fully prepared by the dispatcher (on the main thread with PGlite, in the first worker on PostgreSQL). */
export interface DeliveryJob {
  url: string
  headers: Record<string, string>
  body: string
  /**
   * The webhook a delivery of the outbox goes to, by which its job can be cancelled while queued;
   * a test ping has none (Deliveries sends it first).
   */
  webhookId?: string
}

export interface WorkerSend extends DeliveryJob {
  type: 'send'
  id: number
}

/**
 * Why no HTTP status came back. A delivery without a response records status 0 (see README):
 * the receiver timed out, refused or reset the connection, failed TLS, did not resolve, or the
 * target was refused by the private-address guard.
 */
export type FailureReason = 'timeout' | 'connection' | 'blocked' | 'worker' | 'cancelled'

/**
 * Sent to a worker: answer the jobs still queued (never sent) with reason 'cancelled': every one at
 * shutdown (null), or those of webhooks changed since their deliveries were claimed (Withdrawn).
 */
export interface CancelQueued {
  type: 'cancel'
  withdrawn: [string, string | null][] | null
}

/**
 * Webhooks changed since deliveries of theirs were claimed, each with the URL its deliveries now go
 * to (null: none, disabled or deleted): their queued jobs for any other URL are cancelled.
 */
export type Withdrawn = ReadonlyMap<string, string | null>

/** Sent to the worker running the dispatcher after a commit wrote events: look for work now. */
export const KICK = 'kick'

/** Sent to every worker now and then: it answers `{ type: 'pong' }` at once, unless it is stuck. */
export const PING = 'ping'

/**
 * Starts the outbox dispatcher inside a worker (PostgreSQL only): it claims, signs, sends and
 * records on a connection of its own, so none of that per-delivery work runs on the API thread.
 */
export interface DispatchStart {
  type: 'dispatch'
  databaseUrl: string
  /** The dispatcher's options (see DispatcherOptions). */
  options: Record<string, number | undefined>
  logLevel: 'debug' | 'info' | 'warn' | 'error'
}

/** Main thread → dispatching worker: stop claiming, finish what is out, record it, then answer 'stopped'. */
export interface DispatchStop {
  type: 'stop'
}

/**
 * Webhook secrets are sealed under the master key, which stays on the main thread: the dispatching
 * worker asks for each webhook's secret once and keeps it.
 */
export interface SecretRequest {
  type: 'open'
  sealed: string
}
export interface SecretReply {
  type: 'opened'
  sealed: string
  secret: string | null
}

/** The dispatching worker's recorded attempts, by outcome, for the main thread's webhook_deliveries_total. */
export interface RecordedAttempts {
  type: 'recorded'
  outcomes: Record<string, number>
}

/**
 * The jobs from the main thread a worker began to send in one turn: if the worker is lost, the others
 * never left it and go to another worker (pool.ts).
 */
export interface JobsStarted {
  type: 'started'
  ids: number[]
}

/** Control messages a worker sends besides its (string) batches of replies. */
export type WorkerEvent = SecretRequest | RecordedAttempts | JobsStarted | { type: 'stopped' } | { type: 'pong' }

export interface DeliveryResult {
  /** The receiver's HTTP status, or 0 when there was no response. */
  status: number
  reason?: FailureReason
}

export interface WorkerReply extends DeliveryResult {
  id: number
}
