/** Messages between the delivery pool (main thread) and its workers. */

export interface WorkerInit {
  type: 'init'
  allowPrivate: boolean
  /** Trusted CAs for deliveries (the system roots plus NODE_EXTRA_CA_CERTS), or null for the defaults. */
  ca: string[] | null
  timeoutMs: number
  /** Requests a worker has open at once; more wait in its queue. */
  concurrency: number
  /** Run delivery threads at the lowest CPU priority (the server; not tests sharing a process). */
  lowPriority: boolean
}

/** One signed POST, fully prepared by the main thread: the worker never sees the webhook secret. */
export interface DeliveryJob {
  url: string
  headers: Record<string, string>
  body: string
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

/** Sent to a worker at shutdown: answer every job still queued (never sent) with reason 'cancelled'. */
export const CANCEL_QUEUED = 'cancel-queued'

export interface DeliveryResult {
  /** The receiver's HTTP status, or 0 when there was no response. */
  status: number
  reason?: FailureReason
}

export interface WorkerReply extends DeliveryResult {
  id: number
}
