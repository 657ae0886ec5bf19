import type { DeliveryJob, DeliveryResult, WorkerInit } from '../protocol'
import { pinnedTarget, resolvePublicTarget, TargetError } from '../target'
import { LowPriority } from './priority'

interface Queued {
  job: DeliveryJob
  done: (result: DeliveryResult) => void
}

/**
 * This worker's sending side: its settings, the requests it has open and the jobs waiting for one.
 * Requests to one receiver beyond a few dozen at once stop reusing keep-alive connections and pay a
 * TLS handshake each: jobs beyond `concurrency` wait here (their 10 s start when they are sent).
 */
export class Deliveries {
  #settings: WorkerInit = { type: 'init', allowPrivate: false, ca: null, timeoutMs: 10_000, concurrency: 16, lowPriority: false }
  readonly #queue: Queued[] = []
  #active = 0
  readonly #priority = new LowPriority()

  configure(settings: WorkerInit): void {
    this.#settings = settings
  }

  /** Queues one delivery: jobs from the main thread and from this worker's dispatcher alike. */
  send(job: DeliveryJob): Promise<DeliveryResult> {
    return new Promise((done) => {
      this.#queue.push({ job, done })
      this.#next()
    })
  }

  /** Answers every job still queued (never sent) with reason 'cancelled'. */
  cancelQueued(): void {
    for (const { done } of this.#queue.splice(0)) done({ status: 0, reason: 'cancelled' })
  }

  #next(): void {
    while (this.#active < this.#settings.concurrency && this.#queue.length > 0) {
      const { job, done } = this.#queue.shift() as Queued
      this.#active++
      void this.#deliver(job).then((result) => {
        this.#active--
        done(result)
        this.#next()
      })
    }
  }

  async #deliver(job: DeliveryJob): Promise<DeliveryResult> {
    const settings = this.#settings
    // One budget for the address check and the request together: the spec's 10 seconds per delivery.
    const signal = AbortSignal.timeout(settings.timeoutMs)
    try {
      let url = new URL(job.url)
      let headers = job.headers
      const tls: { ca?: string[]; serverName?: string } = settings.ca ? { ca: settings.ca } : {}
      if (!settings.allowPrivate) {
        const [address] = await resolvePublicTarget(url, Math.min(5_000, settings.timeoutMs))
        const pinned = address ? pinnedTarget(url, address) : null
        if (pinned) {
          url = pinned.url
          headers = { ...headers, host: pinned.host }
          tls.serverName = pinned.serverName
        }
      }
      const res = await fetch(url, {
        method: 'POST',
        headers,
        body: job.body,
        redirect: 'manual',
        signal,
        ...(Object.keys(tls).length > 0 ? { tls } : {}),
      })
      // Only the status matters; dropping the body frees the connection without buffering it.
      await res.body?.cancel().catch(() => {})
      return { status: res.status }
    } catch (err) {
      if (err instanceof TargetError) return { status: 0, reason: 'blocked' }
      if (signal.aborted) return { status: 0, reason: 'timeout' }
      return { status: 0, reason: 'connection' }
    } finally {
      if (settings.lowPriority) this.#priority.apply()
    }
  }
}
