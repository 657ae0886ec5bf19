/// <reference lib="webworker" />
import { readdirSync, readFileSync } from 'node:fs'
import { setPriority } from 'node:os'
import { type Db, POOL_OPTIONS } from '../db/client'
import { errorFields, log, setLogLevel } from '../lib/log'
import type { RunningDispatcher } from './dispatcher'
import {
  CANCEL_QUEUED,
  type DeliveryJob,
  type DeliveryResult,
  type DispatchStart,
  type DispatchStop,
  KICK,
  type SecretReply,
  type SecretRequest,
  type WorkerInit,
  type WorkerReply,
  type WorkerSend,
} from './protocol'
import { pinnedTarget, resolvePublicTarget, TargetError } from './target'

/**
 * A delivery worker: sends prepared, signed POSTs so that slow or dead receivers cost the API
 * thread nothing. Started once at boot by the pool and kept for the life of the process. On
 * PostgreSQL the pool's first worker also runs the outbox dispatcher (see startDispatcher).
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

async function deliver(job: DeliveryJob): Promise<DeliveryResult> {
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
interface Queued {
  job: DeliveryJob
  done: (result: DeliveryResult) => void
}
const queue: Queued[] = []
let active = 0
function next(): void {
  while (active < settings.concurrency && queue.length > 0) {
    const { job, done } = queue.shift() as Queued
    active++
    void deliver(job).then((result) => {
      active--
      done(result)
      next()
    })
  }
}

/** Queues one delivery on this worker: jobs from the main thread and from the dispatcher alike. */
function sendHere(job: DeliveryJob): Promise<DeliveryResult> {
  return new Promise((done) => {
    queue.push({ job, done })
    next()
  })
}

function cancelQueued(): void {
  for (const { done } of queue.splice(0)) done({ status: 0, reason: 'cancelled' })
}

// The dispatcher, when this worker runs it: its wake-ups, and its secret requests to the main thread.
let dispatcher: Promise<{ running: RunningDispatcher; close: () => Promise<void> }> | null = null
const wakeUps = new Set<() => void>()
const secretWaits = new Map<string, ((secret: string | null) => void)[]>()

function openSecret(sealed: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const waits = secretWaits.get(sealed)
    const done = (secret: string | null) =>
      secret === null ? reject(new Error('webhook secret could not be opened')) : resolve(secret)
    if (waits) return void waits.push(done)
    secretWaits.set(sealed, [done])
    const request: SecretRequest = { type: 'open', sealed }
    self.postMessage(request)
  })
}

async function startDispatching(msg: DispatchStart) {
  setLogLevel(msg.logLevel)
  const { default: postgres } = await import('postgres')
  const { drizzle } = await import('drizzle-orm/postgres-js')
  const { WebhookDispatcher } = await import('./dispatcher')
  // Claims, records and the poll's fan-out run one at a time; two connections let a purge overlap.
  const client = postgres(msg.databaseUrl, { ...POOL_OPTIONS, max: 2 })
  const running = new WebhookDispatcher(
    {
      db: drizzle({ client }) as unknown as Db,
      send: sendHere,
      cancelQueued,
      openSecret,
      onCommit: (listener) => {
        wakeUps.add(listener)
        return () => wakeUps.delete(listener)
      },
      clock: Date.now,
    },
    msg.options,
  ).start()
  return { running, close: () => client.end({ timeout: 5 }) }
}

type Incoming = WorkerInit | DispatchStart | DispatchStop | SecretReply | string

self.onmessage = (event: MessageEvent<Incoming>) => {
  const msg = event.data
  if (typeof msg !== 'string') {
    if (msg.type === 'init') settings = msg
    else if (msg.type === 'dispatch') dispatcher ??= startDispatching(msg)
    else if (msg.type === 'opened') {
      for (const done of secretWaits.get(msg.sealed) ?? []) done(msg.secret)
      secretWaits.delete(msg.sealed)
    } else if (msg.type === 'stop') {
      const stopping = dispatcher
      dispatcher = null
      void (async () => {
        try {
          if (stopping) {
            const { running, close } = await stopping
            await running.stop()
            await close()
          }
        } catch (err) {
          log.error('webhook dispatcher did not stop cleanly', errorFields(err))
        } finally {
          self.postMessage({ type: 'stopped' })
        }
      })()
    }
    return
  }
  if (msg === KICK) {
    for (const wake of wakeUps) wake()
    return
  }
  if (msg === CANCEL_QUEUED) return cancelQueued()
  for (const { id, type: _, ...job } of JSON.parse(msg) as WorkerSend[]) {
    void sendHere(job).then((result) => reply({ id, ...result }))
  }
}
