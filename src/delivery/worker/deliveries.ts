import type { DeliveryJob, DeliveryResult, WorkerInit, Withdrawn } from '../protocol'
import { parseTargetUrl, pinnedTarget, resolvePublicTarget, TargetError } from '../target'
import { LowPriority } from './priority'

interface Queued {
  job: DeliveryJob
  /** host:port of the job's URL, whose open requests `perHost` counts. */
  host: string
  done: (result: DeliveryResult) => void
  started?: () => void
}

/**
 * This worker's sending side: its settings, the requests it has open and the jobs waiting for one.
 * Requests to one receiver beyond a few dozen at once stop reusing keep-alive connections and pay a
 * TLS handshake each: jobs beyond `perHost` to one host, or `concurrency` in all, wait here (their
 * 10 s start when they are sent). A job waits behind its own host's, not behind another host's: a
 * receiver that hangs holds `perHost` requests for 10 s each, and every other receiver is served
 * meanwhile.
 */
export class Deliveries {
  #settings: WorkerInit = {
    type: 'init',
    allowPrivate: false,
    ca: null,
    timeoutMs: 10_000,
    concurrency: 256,
    perHost: 16,
    lowPriority: false,
  }
  readonly #queue: Queued[] = []
  #active = 0
  /** Open requests by host; a host with none has no entry. */
  readonly #activeByHost = new Map<string, number>()
  readonly #priority = new LowPriority()

  /** `resolve` vets a receiver's host and gives its addresses (target.ts; a test's own in tests). */
  constructor(private readonly resolve = resolvePublicTarget) {}

  configure(settings: WorkerInit): void {
    this.#settings = settings
  }

  /**
   * Queues one delivery: jobs from the main thread and from this worker's dispatcher alike. A test
   * ping (a job of no webhook's outbox) goes ahead of the outbox deliveries queued, and past its host's
   * limit: asked for by hand and answered while its caller waits, it must not queue behind a hanging
   * receiver's backlog (8 an account at most are on their way, webhooks/service.ts). `started` is
   * called when the job leaves the queue to be sent.
   */
  send(job: DeliveryJob, started?: () => void): Promise<DeliveryResult> {
    return new Promise((done) => {
      const queued: Queued = { job, host: hostOf(job.url), done, started }
      // Behind the pings queued before it, ahead of every outbox delivery.
      const firstDelivery = job.webhookId === undefined ? this.#queue.findIndex((q) => q.job.webhookId !== undefined) : -1
      if (firstDelivery >= 0) this.#queue.splice(firstDelivery, 0, queued)
      else this.#queue.push(queued)
      this.#next()
    })
  }

  /**
   * Answers the jobs still queued (never sent) with reason 'cancelled': every one, or those of the
   * `withdrawn` webhooks that go to another URL than the webhook's now (a job already sent again to
   * the new URL keeps its place).
   */
  cancelQueued(withdrawn: Withdrawn | null = null): void {
    const kept: Queued[] = []
    for (const queued of this.#queue.splice(0)) {
      const { webhookId, url } = queued.job
      const now = webhookId === undefined ? undefined : withdrawn?.get(webhookId)
      if (withdrawn && (now === undefined || now === url)) kept.push(queued)
      else queued.done({ status: 0, reason: 'cancelled' })
    }
    this.#queue.push(...kept)
  }

  /** Starts the oldest queued jobs whose hosts have room, while requests are free. */
  #next(): void {
    const { concurrency, perHost } = this.#settings
    for (let i = 0; i < this.#queue.length && this.#active < concurrency; ) {
      const { job, host, done, started } = this.#queue[i] as Queued
      const open = this.#activeByHost.get(host) ?? 0
      if (open >= perHost && job.webhookId !== undefined) {
        i++
        continue
      }
      this.#queue.splice(i, 1)
      this.#active++
      this.#activeByHost.set(host, open + 1)
      started?.()
      void this.#deliver(job).then((result) => {
        this.#active--
        const left = (this.#activeByHost.get(host) ?? 1) - 1
        if (left > 0) this.#activeByHost.set(host, left)
        else this.#activeByHost.delete(host)
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
      // Checked again here: a URL stored before the checks of today (plain http, say) would carry a
      // signed payload in the clear, and with private targets allowed, file:// "delivered" a local read.
      const url = parseTargetUrl(job.url)
      const addresses = settings.allowPrivate ? [null] : await this.resolve(url, Math.min(5_000, settings.timeoutMs))
      for (const [i, address] of addresses.entries()) {
        try {
          return await this.#post(job, url, address, signal)
        } catch (err) {
          // Refused or unreachable before a byte was sent (an AAAA record on a host without IPv6 routes):
          // the receiver's next vetted address may answer, and nothing was sent twice.
          const code = (err as { code?: string }).code
          if (i + 1 < addresses.length && !signal.aborted && code !== undefined && NOT_CONNECTED.has(code)) continue
          throw err
        }
      }
      return { status: 0, reason: 'connection' }
    } catch (err) {
      if (err instanceof TargetError) return { status: 0, reason: 'blocked' }
      if (signal.aborted) return { status: 0, reason: 'timeout' }
      return { status: 0, reason: 'connection' }
    } finally {
      if (settings.lowPriority) this.#priority.apply()
    }
  }

  /** One POST of the job to `url`, connecting to `address` (a vetted one, or null: as the URL resolves). */
  async #post(job: DeliveryJob, url: URL, address: string | null, signal: AbortSignal): Promise<DeliveryResult> {
    const tls: { ca?: string[]; serverName?: string } = this.#settings.ca ? { ca: this.#settings.ca } : {}
    const pinned = address ? pinnedTarget(url, address) : null
    if (pinned) tls.serverName = pinned.serverName
    const res = await fetch(pinned?.url ?? url, {
      method: 'POST',
      headers: pinned ? { ...job.headers, host: pinned.host } : job.headers,
      body: job.body,
      redirect: 'manual',
      signal,
      ...(Object.keys(tls).length > 0 ? { tls } : {}),
    })
    // Only the status matters; dropping the body frees the connection without buffering it.
    await res.body?.cancel().catch(() => {})
    return { status: res.status }
  }
}

/** Connection errors that come before any byte of a request is sent. */
const NOT_CONNECTED = new Set(['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'EADDRNOTAVAIL'])

/** The host (and port) requests to a URL count under; a URL that does not parse fails on its own when sent. */
function hostOf(url: string): string {
  try {
    return new URL(url).host
  } catch {
    return url
  }
}
