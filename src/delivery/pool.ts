import { readFileSync } from 'node:fs'
import { rootCertificates } from 'node:tls'
import { TurnBatcher } from '../lib/batcher'
import type { Sealer } from '../lib/crypto'
import type { LabeledCounter } from '../lib/metrics'
import { errorFields, log } from '../lib/log'
import { withTimeout } from '../lib/with-timeout'
import type { DispatcherOptions, RunningDispatcher } from './dispatch/options'
import type { EventBus } from './outbox'
import {
  type CancelQueued,
  type DeliveryJob,
  type Withdrawn,
  type DeliveryResult,
  type DispatchStart,
  KICK,
  PING,
  type SecretReply,
  type WorkerEvent,
  type WorkerInit,
  type WorkerReply,
  type WorkerSend,
} from './protocol'

export interface DeliveryPoolOptions {
  /**
   * Worker threads; each sends many requests concurrently, so two cover a 2-core machine. On
   * PostgreSQL the first also runs the dispatcher (see dispatch()) and test pings use the others.
   */
  size?: number
  allowPrivate: boolean
  /**
   * PEM file of a CA to trust on top of what the process trusts: for a process that did not start
   * with NODE_EXTRA_CA_CERTS set (in-process tests). Costs a TLS context per request.
   */
  extraCaFile: string | null
  timeoutMs?: number
  /**
   * Requests each worker has open at once. By default as many as a dispatcher has deliveries on the way
   * (256): fewer, and receivers that hang on a few hosts (16 requests each) would hold every request
   * while deliveries the dispatcher claimed for other accounts waited behind them.
   */
  concurrency?: number
  /** Of those, at most this many to one host. */
  perHost?: number
  /** Lowest CPU priority for the delivery threads, so API requests win a saturated CPU. */
  lowPriority?: boolean
  /** How long a worker may leave a ping unanswered before it is taken for stuck and replaced. */
  stuckAfterMs?: number
  /** How long a stopping dispatcher may take to record what it has out before its worker is ended. */
  dispatchStopMs?: number
}

/**
 * A worker whose event loop is held (a loop that does not end) answers nothing: every delivery and
 * test ping handed to it waited for ever, and a test ping's slot with it. It is pinged every third of
 * this, and replaced when a ping has gone unanswered this long.
 */
const STUCK_AFTER_MS = 15_000
/**
 * A dispatcher's stop waits for the deliveries it has out (each at most the delivery timeout) and
 * records them; one that never answers held the server's shutdown until the supervisor killed it.
 */
const DISPATCH_STOP_MS = 20_000

/** What a dispatching worker needs from this thread: wake-ups after commits, secrets opened, the log level. */
export interface DispatchHost {
  sealer: Pick<Sealer, 'open'>
  bus: Pick<EventBus, 'subscribe'>
  config: { logLevel: DispatchStart['logLevel'] }
  metrics: { webhookDeliveries: LabeledCounter }
}

/** The dispatcher running in the first worker: what restarts it there, and who waits for its stop. */
interface Dispatching {
  start: DispatchStart
  host: DispatchHost
  unsubscribe: () => void
  stopped: (() => void)[]
  stopping: boolean
}

/** A job handed to a worker and not answered yet. */
interface Pending {
  job: WorkerSend
  resolve: (result: DeliveryResult) => void
  /** Posted to the worker (not only waiting in the slot's `jobs`). */
  posted: boolean
  /** The worker reported it sent (its request may have reached the receiver). */
  started: boolean
  /** Already sent again once after its worker was lost: a job that kills every worker it is given ends there. */
  resent: boolean
}

interface Slot {
  worker: Worker
  pending: Map<number, Pending>
  /** A message per delivery costs more than the request itself: a turn's jobs travel as one string. */
  jobs: TurnBatcher<WorkerSend>
  /** When the ping not answered yet was sent (performance.now()); null when none is out. */
  pingedAt: number | null
  /** Failed, exited or replaced: its later messages and its own end are not acted on again. */
  lost: boolean
}

/**
 * A small, fixed pool of delivery workers. Workers start on first use and live until close():
 * Bun's docs still call terminating workers experimental, so they are never recycled per delivery.
 */
export class DeliveryPool {
  readonly #size: number
  readonly #init: WorkerInit
  readonly #slots: (Slot | undefined)[]
  #seq = 0
  #closed = false
  #dispatching: Dispatching | null = null
  readonly #stuckAfterMs: number
  readonly #dispatchStopMs: number
  #pinger: ReturnType<typeof setInterval> | null = null
  /**
   * Webhooks withdrawn (cancelQueued), each with the URL its deliveries now go to (null: none) and the
   * last job id given out before: a job of it up to then for another URL must not be sent, by a worker
   * that never read the cancel (stuck, or lost first) nor by the one a lost worker's jobs go to.
   */
  readonly #withdrawals = new Map<string, { url: string | null; before: number }>()
  /** The last job id given out before a cancelQueued of every job (shutdown): none up to it is to be sent. */
  #cancelledUpTo = 0

  constructor(options: DeliveryPoolOptions) {
    this.#size = Math.max(1, options.size ?? 2)
    this.#stuckAfterMs = options.stuckAfterMs ?? STUCK_AFTER_MS
    this.#dispatchStopMs = options.dispatchStopMs ?? DISPATCH_STOP_MS
    this.#slots = new Array(this.#size).fill(undefined)
    // A `ca` list replaces the default roots, so the system roots go in with the extra CA.
    const ca = options.extraCaFile ? [...rootCertificates, readFileSync(options.extraCaFile, 'utf8')] : null
    this.#init = {
      type: 'init',
      allowPrivate: options.allowPrivate,
      ca,
      timeoutMs: options.timeoutMs ?? 10_000,
      concurrency: options.concurrency ?? 256,
      perHost: options.perHost ?? 16,
      lowPriority: options.lowPriority ?? false,
    }
  }

  /** How long a delivery may take, its address check included: after that it ends with status 0. */
  get timeoutMs(): number {
    return this.#init.timeoutMs
  }

  /** Sends one prepared delivery on the least busy worker; never rejects. */
  send(job: DeliveryJob): Promise<DeliveryResult> {
    if (this.#closed) return Promise.resolve({ status: 0, reason: 'worker' })
    const id = ++this.#seq
    return new Promise((resolve) => this.#queue({ job: { type: 'send', id, ...job }, resolve, posted: false, started: false, resent: false }))
  }

  #queue(pending: Pending): void {
    const slot = this.#leastBusy()
    slot.pending.set(pending.job.id, pending)
    slot.jobs.add(pending.job)
    // While a job waits, the pinger keeps the process: a stop waiting on a stuck worker's jobs would
    // otherwise end the process mid-shutdown (exit 0), their claims neither recorded nor handed back.
    this.#pinger?.ref()
  }

  /** Whether a job not started yet is no longer to be sent (see #withdrawals, #cancelledUpTo). */
  #unwanted(job: WorkerSend): boolean {
    if (job.id <= this.#cancelledUpTo) return true
    const withdrawal = job.webhookId === undefined ? undefined : this.#withdrawals.get(job.webhookId)
    return withdrawal !== undefined && job.id <= withdrawal.before && job.url !== withdrawal.url
  }

  /** A withdrawal matters while a job given out before it waits. */
  #forgetWithdrawals(): void {
    let oldest = Number.POSITIVE_INFINITY
    for (const slot of this.#slots) for (const id of slot?.pending.keys() ?? []) oldest = Math.min(oldest, id)
    for (const [webhookId, withdrawal] of this.#withdrawals) if (withdrawal.before < oldest) this.#withdrawals.delete(webhookId)
    if (oldest === Number.POSITIVE_INFINITY) this.#pinger?.unref()
  }

  /**
   * Runs the outbox dispatcher in the first worker, on a PostgreSQL connection of its own: commits
   * announced on host.bus wake it, and it asks this thread to open webhook secrets (the master key
   * stays here). One dispatcher per pool.
   */
  dispatch(databaseUrl: string, options: DispatcherOptions, host: DispatchHost): RunningDispatcher {
    if (this.#dispatching) throw new Error('this delivery pool already runs a dispatcher')
    const start: DispatchStart = { type: 'dispatch', databaseUrl, options: { ...options }, logLevel: host.config.logLevel }
    const unsubscribe = host.bus.subscribe(() => this.#slots[0]?.worker.postMessage(KICK))
    this.#dispatching = { start, host, unsubscribe, stopped: [], stopping: false }
    // A worker spawned now gets the start message with its settings; one already running, here.
    const first = this.#slots[0]
    if (first) first.worker.postMessage(start)
    this.start()
    const stop = () => this.#stopDispatch()
    return { stop, [Symbol.asyncDispose]: stop }
  }

  async #stopDispatch(): Promise<void> {
    const d = this.#dispatching
    const slot = this.#slots[0]
    if (!d) return
    d.unsubscribe()
    if (slot && !this.#closed) {
      const done = new Promise<void>((resolve) => d.stopped.push(resolve))
      if (!d.stopping) slot.worker.postMessage({ type: 'stop' })
      d.stopping = true
      // Ended past its time: what it had claimed is sent again after the lease, by the next start.
      if ((await withTimeout(done, this.#dispatchStopMs)) === null && this.#slots[0] === slot) {
        this.#lose(0, slot, new Error(`the dispatcher did not stop within ${this.#dispatchStopMs} ms`))
      }
    }
    if (this.#dispatching === d) this.#dispatching = null
  }

  /** Starts every worker now (the server does at boot), so the first delivery does not wait for one. */
  start(): void {
    if (this.#closed) return
    for (let i = 0; i < this.#size; i++) if (!this.#slots[i]) this.#spawn(i)
  }

  /**
   * Answers the jobs still waiting in a worker's queue (never sent) with reason 'cancelled'; requests
   * already open run to their end. Every job at shutdown, so that the caller can hand them back
   * instead of losing them; or those `withdrawn` names (their webhooks changed since the claim).
   */
  cancelQueued(withdrawn: Withdrawn | null = null): void {
    const cancel: CancelQueued = { type: 'cancel', withdrawn: withdrawn && [...withdrawn] }
    if (withdrawn) for (const [webhookId, url] of withdrawn) this.#withdrawals.set(webhookId, { url, before: this.#seq })
    else this.#cancelledUpTo = this.#seq
    for (const slot of this.#slots) {
      if (!slot) continue
      // Jobs not posted yet are cancelled here (their batch leaves them out); those already posted, by the worker.
      for (const [id, pending] of slot.pending) {
        if (pending.posted || !this.#unwanted(pending.job)) continue
        slot.pending.delete(id)
        pending.resolve({ status: 0, reason: 'cancelled' })
      }
      slot.worker.postMessage(cancel)
    }
    this.#forgetWithdrawals()
  }

  /** Deliveries handed to a worker and not answered yet. */
  get inFlight(): number {
    return this.#slots.reduce((n, s) => n + (s?.pending.size ?? 0), 0)
  }

  /** Stops the workers; deliveries still in flight count as attempted without a response. */
  async close(): Promise<void> {
    // A dispatcher still running records what it has out before its worker goes.
    if (this.#dispatching && !this.#closed) await this.#stopDispatch()
    this.#closed = true
    if (this.#pinger) clearInterval(this.#pinger)
    for (let i = 0; i < this.#slots.length; i++) {
      const slot = this.#slots[i]
      if (!slot) continue
      this.#slots[i] = undefined
      slot.lost = true
      for (const pending of slot.pending.values()) pending.resolve({ status: 0, reason: 'worker' })
      slot.pending.clear()
      slot.worker.terminate()
    }
  }

  #leastBusy(): Slot {
    let best: Slot | undefined
    // The dispatching worker's own queue (up to maxInFlight deliveries) is invisible here: a test
    // ping goes to another worker when there is one, so it never waits behind a backlog.
    const first = this.#dispatching && this.#size > 1 ? 1 : 0
    for (let i = first; i < this.#size; i++) {
      const slot = this.#slots[i] ?? this.#spawn(i)
      if (!best || slot.pending.size < best.pending.size) best = slot
    }
    return best as Slot
  }

  #spawn(index: number): Slot {
    const worker = new Worker(new URL('./worker/thread.ts', import.meta.url).href)
    const slot: Slot = { worker, pending: new Map(), jobs: new TurnBatcher((jobs) => this.#post(slot, jobs)), pingedAt: null, lost: false }
    worker.onmessage = (event: MessageEvent<string | WorkerEvent>) => {
      if (slot.lost) return
      if (typeof event.data !== 'string') return this.#control(slot, event.data)
      for (const { id, ...result } of JSON.parse(event.data) as WorkerReply[]) {
        const pending = slot.pending.get(id)
        slot.pending.delete(id)
        pending?.resolve(result)
      }
      if (this.inFlight === 0) this.#pinger?.unref()
    }
    worker.onerror = (event) => this.#lose(index, slot, event.error ?? event.message)
    // Ended without an error (terminated, process.exit in it): what it held would wait for ever.
    worker.addEventListener('close', () => this.#lose(index, slot, new Error('the webhook delivery worker exited')))
    if (!this.#pinger) {
      // Held only while a job waits (#queue): the pool must not keep a finished process (a test, the CLI).
      this.#pinger = setInterval(() => this.#ping(), this.#stuckAfterMs / 3)
      this.#pinger.unref()
    }
    worker.postMessage(this.#init)
    if (index === 0 && this.#dispatching && !this.#dispatching.stopping) worker.postMessage(this.#dispatching.start)
    // The pool must not keep a finished process (a test, the CLI) alive.
    worker.unref()
    this.#slots[index] = slot
    return slot
  }

  /**
   * A worker that failed, exited or is stuck: it is replaced, and the jobs it never started go to
   * another worker (there are no retries: a delivery answered 'worker' is recorded as attempted and
   * never sent again), unless they were cancelled meanwhile (a cancel the worker never read): those
   * end 'cancelled', for the caller to send as the webhook now is or hand back. Those it started end
   * with reason 'worker', as does a job lost with a second worker. The dispatcher dies with the first:
   * what it had claimed is sent again after the lease, and a replacement worker takes over the rest.
   */
  #lose(index: number, slot: Slot, err: unknown): void {
    if (slot.lost || this.#closed) return
    slot.lost = true
    log.error('webhook delivery worker failed; replacing it', errorFields(err))
    if (this.#slots[index] === slot) this.#slots[index] = undefined
    slot.worker.terminate()
    if (index === 0 && this.#dispatching) {
      for (const resolve of this.#dispatching.stopped.splice(0)) resolve()
      if (!this.#dispatching.stopping) this.#spawn(0)
    }
    const lost = [...slot.pending.values()]
    slot.pending.clear()
    for (const pending of lost) {
      if (pending.started) pending.resolve({ status: 0, reason: 'worker' })
      else if (this.#unwanted(pending.job)) pending.resolve({ status: 0, reason: 'cancelled' })
      else if (pending.resent) pending.resolve({ status: 0, reason: 'worker' })
      else this.#queue({ ...pending, posted: false, resent: true })
    }
    this.#forgetWithdrawals()
  }

  /** Pings each worker whose last ping was answered; one that has left a ping unanswered too long is lost. */
  #ping(): void {
    const now = performance.now()
    this.#slots.forEach((slot, index) => {
      if (!slot) return
      if (slot.pingedAt === null) {
        slot.pingedAt = now
        slot.worker.postMessage(PING)
      } else if (now - slot.pingedAt > this.#stuckAfterMs) {
        this.#lose(index, slot, new Error(`the webhook delivery worker left a ping unanswered for ${this.#stuckAfterMs} ms`))
      }
    })
  }

  /** A worker's own messages: a ping answered; a dispatching worker's secret to open, or the end of its stop. */
  #control(slot: Slot, msg: WorkerEvent): void {
    const d = this.#dispatching
    if (msg.type === 'pong') {
      slot.pingedAt = null
      return
    }
    if (msg.type === 'stopped') {
      for (const resolve of d?.stopped.splice(0) ?? []) resolve()
      return
    }
    if (msg.type === 'started') {
      for (const id of msg.ids) {
        const pending = slot.pending.get(id)
        if (pending) pending.started = true
      }
      return
    }
    if (msg.type === 'recorded') {
      d?.host.metrics.webhookDeliveries.addAll(msg.outcomes)
      return
    }
    let secret: string | null = null
    try {
      if (d) secret = d.host.sealer.open(msg.sealed).toString('utf8')
    } catch {
      // Sealed under another master key, or damaged: the dispatcher logs it and records status 0.
    }
    const reply: SecretReply = { type: 'opened', sealed: msg.sealed, secret }
    slot.worker.postMessage(reply)
  }

  #post(slot: Slot, jobs: WorkerSend[]): void {
    // Jobs answered before their turn ended (cancelled, or their worker failed) must not be sent.
    const live: WorkerSend[] = []
    for (const job of jobs) {
      const pending = slot.pending.get(job.id)
      if (!pending) continue
      pending.posted = true
      live.push(job)
    }
    if (live.length > 0) slot.worker.postMessage(JSON.stringify(live))
  }
}
