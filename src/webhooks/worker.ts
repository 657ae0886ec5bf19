/// <reference lib="webworker" />
import { readdirSync, readFileSync } from 'node:fs'
import { setPriority } from 'node:os'
import { CANCEL_QUEUED, type DeliveryResult, type WorkerInit, type WorkerReply, type WorkerSend } from './protocol'
import { pinnedTarget, resolvePublicTarget, TargetError } from './target'

/**
 * A delivery worker: sends prepared, signed POSTs so that slow or dead receivers cost the API
 * thread nothing. Started once at boot by the pool and kept for the life of the process.
 */
declare var self: Worker

let settings: WorkerInit = { type: 'init', allowPrivate: false, ca: null, timeoutMs: 10_000, concurrency: 16, lowPriority: false }

/**
 * Deliveries are background work: this thread and Bun's HTTP client thread (which runs every fetch
 * of the process, and only deliveries fetch in the server) run at the lowest CPU priority, so when
 * the machine is saturated API requests get the CPU first. Linux applies nice per thread; elsewhere,
 * or without permission, this does nothing.
 */
let loweredSelf = false
let loweredHttp = false
function lowerPriority(): void {
  if (loweredHttp) return
  try {
    if (!loweredSelf) setPriority(0, 19)
    loweredSelf = true
    // Bun starts its HTTP client thread with the first fetch: look until it is there.
    for (const tid of readdirSync('/proc/self/task')) {
      if (readFileSync(`/proc/self/task/${tid}/comm`, 'utf8').trim() === 'HTTP Client') {
        setPriority(Number(tid), 19)
        loweredHttp = true
      }
    }
  } catch {
    // Not Linux, or not allowed: deliveries simply share the CPU evenly.
    loweredHttp = true
  }
}

async function deliver(job: WorkerSend): Promise<DeliveryResult> {
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
    if (settings.lowPriority) lowerPriority()
  }
}

// Replies finished in the same tick travel back as one message, like the jobs came in.
let replies: WorkerReply[] = []
function reply(r: WorkerReply): void {
  if (replies.push(r) === 1) {
    queueMicrotask(() => {
      const batch = replies
      replies = []
      self.postMessage(JSON.stringify(batch))
    })
  }
}

// Requests to one receiver beyond a few dozen at once stop reusing keep-alive connections and pay a
// TLS handshake each: jobs beyond the limit wait here (their 10 s start when they are sent).
const queue: WorkerSend[] = []
let active = 0
function next(): void {
  while (active < settings.concurrency && queue.length > 0) {
    const job = queue.shift() as WorkerSend
    active++
    void deliver(job).then((result) => {
      active--
      reply({ id: job.id, ...result })
      next()
    })
  }
}

self.onmessage = (event: MessageEvent<WorkerInit | string>) => {
  const msg = event.data
  if (typeof msg !== 'string') {
    settings = msg
    return
  }
  if (msg === CANCEL_QUEUED) {
    for (const job of queue.splice(0)) reply({ id: job.id, status: 0, reason: 'cancelled' })
    return
  }
  queue.push(...(JSON.parse(msg) as WorkerSend[]))
  next()
}
