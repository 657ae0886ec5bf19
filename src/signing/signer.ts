import type { KeyObject } from 'node:crypto'
import { errorFields, log } from '../lib/log'
import { signText } from '../lib/crypto'
import { TurnBatcher } from '../lib/batcher'
import { Deadline } from '../lib/with-timeout'

/** Messages to the signing worker; it answers each 'sign' message with one signature (or null) per text. */
export type SignerMessage =
  | { type: 'key'; keyId: string; pkcs8: Uint8Array }
  | { type: 'forget' }
  | { type: 'sign'; keyIds: string[]; texts: string[] }

interface Job {
  keyId: string
  key: KeyObject
  text: string
  resolve(signature: string): void
  reject(err: unknown): void
}

/**
 * Signs a job on this thread. A key that cannot sign fails its own request alone: thrown from a loop
 * over a batch, it left the jobs after it waiting for ever, and from a worker's handler it ended the
 * process.
 */
function signHere(job: Job): void {
  try {
    job.resolve(signText(job.text, job.key))
  } catch (err) {
    job.reject(err)
  }
}

/** Keys the worker may hold at once; past this it forgets them all and is sent those in use again. */
const MAX_WORKER_KEYS = 4096
/** After a second failure in a row, the wait before the next worker starts: doubled at each, up to the last. */
const FIRST_RETRY_MS = 1000
const LAST_RETRY_MS = 60_000
/**
 * How long the worker may leave its oldest batch unanswered (a few thousand signatures take it tens of
 * ms) before it is taken for stuck, in a loop or waiting on nothing: its batches are then signed here
 * and a new worker starts. Without it, each request behind a stuck worker waited for ever, its credit
 * charged.
 */
const ANSWER_DEADLINE_MS = 3000

/**
 * Ed25519 signing on a worker thread. A sign costs ~20 µs, the largest single cost of a client
 * request, and the HTTP work of every request runs on the one main thread: handing a turn's
 * signatures over in one message costs that thread ~1 µs each instead, and the second core signs.
 * If the worker fails, its pending texts are signed here and a new worker starts with the next batch;
 * after failures in a row with no answer between them (a worker that cannot start), batches are signed
 * here for a while before the next try, so a broken worker costs one attempt and one log line a minute
 * at most, not one of each per turn.
 * A server running several processes signs on the calling thread instead (start): on this project's
 * usual hosts (up to 4 cores, the default process count's cap) every core already runs a process's
 * requests, so the hand-off would only add the messages and wake-ups.
 */
export class Signer {
  #worker: SigningWorker | null = null
  /** One message to the worker per turn, however many requests sign in it. */
  readonly #queue = new TurnBatcher<Job>((batch) => this.#post(batch))
  #onCallerThread = false
  readonly #spawnWorker: () => Worker
  readonly #now: () => number
  readonly #answerDeadlineMs: number
  /** Worker failures since a worker last answered. */
  #failures = 0
  #nextStartAt = 0

  /** `spawnWorker` starts a worker of sign-worker.ts; tests stand in for it, the clock and the deadline. */
  constructor(
    spawnWorker: () => Worker = () => new Worker(new URL('./sign-worker.ts', import.meta.url).href),
    now: () => number = () => performance.now(),
    answerDeadlineMs = ANSWER_DEADLINE_MS,
  ) {
    this.#spawnWorker = spawnWorker
    this.#now = now
    this.#answerDeadlineMs = answerDeadlineMs
  }

  sign(keyId: string, key: KeyObject, text: string): Promise<string> {
    return new Promise((resolve, reject) => {
      const job = { keyId, key, text, resolve, reject }
      if (this.#onCallerThread) signHere(job)
      else this.#queue.add(job)
    })
  }

  /**
   * The server's choice at boot: a worker started now, so the first request does not wait for it, or
   * (`worker: false`) every signature made on the calling thread from now on.
   */
  start({ worker }: { worker: boolean }): void {
    this.#onCallerThread = !worker
    if (worker) this.#worker ??= this.#spawn()
  }

  #post(batch: Job[]): void {
    if (!this.#worker && this.#now() < this.#nextStartAt) {
      for (const job of batch) signHere(job)
      return
    }
    let current: SigningWorker | null = null
    try {
      current = this.#worker ??= this.#spawn()
      const { worker, known, posted } = current
      if (known.size + batch.length > MAX_WORKER_KEYS) {
        worker.postMessage({ type: 'forget' } satisfies SignerMessage)
        known.clear()
      }
      const keyIds: string[] = []
      const texts: string[] = []
      for (const job of batch) {
        if (!known.has(job.keyId)) {
          known.add(job.keyId)
          worker.postMessage({
            type: 'key',
            keyId: job.keyId,
            pkcs8: job.key.export({ format: 'der', type: 'pkcs8' }),
          } satisfies SignerMessage)
        }
        keyIds.push(job.keyId)
        texts.push(job.text)
      }
      posted.push(batch)
      worker.postMessage({ type: 'sign', keyIds, texts } satisfies SignerMessage)
      if (posted.length === 1) this.#watch(current)
    } catch (err) {
      // A worker that cannot be started or written to: this batch, and whatever it had, is signed
      // here; left unanswered, each of its requests would hang with its credit charged.
      const retired = current?.posted.includes(batch) ?? false
      this.#retire(current, err)
      if (!retired) for (const job of batch) signHere(job)
    }
  }

  #spawn(): SigningWorker {
    const worker = this.#spawnWorker()
    const signing: SigningWorker = { worker, known: new Set(), posted: [], watchdog: null, retired: false }
    worker.onmessage = (event: MessageEvent<unknown>) => {
      // This worker's own batches: an answer it sent before it failed must never be read as another
      // worker's, whose texts (other apps' payloads) it did not sign.
      if (signing.retired) return
      const signatures = event.data
      // One answer per batch, in order: any other message would pair every later batch with the
      // signatures of the one before.
      if (!Array.isArray(signatures) || signatures.length !== signing.posted[0]?.length) {
        this.#retire(signing, new Error('the signing worker answered out of turn'))
        return
      }
      const batch = signing.posted.shift()!
      if (this.#worker === signing) this.#failures = 0
      this.#watch(signing)
      for (let i = 0; i < batch.length; i++) {
        const job = batch[i] as Job
        const signature = signatures[i] as string | null
        if (signature === null) signHere(job)
        else job.resolve(signature)
      }
    }
    worker.onerror = (event) => this.#retire(signing, event.error ?? event.message)
    // Ended without an error (terminated, process.exit in it): what it held would wait for ever.
    worker.addEventListener('close', () => this.#retire(signing, new Error('the signing worker exited')))
    // A finished process (a test, the CLI) must not be kept alive by an idle signer.
    worker.unref()
    return signing
  }

  /** Gives the worker's oldest batch, if any, the deadline to be answered by. */
  #watch(signing: SigningWorker): void {
    signing.watchdog?.clear()
    const oldest = signing.posted[0]
    signing.watchdog = null
    if (!oldest) return
    signing.watchdog = new Deadline(() => {
      if (signing.posted[0] === oldest) this.#retire(signing, new Error(`the signing worker left a batch unanswered for ${this.#answerDeadlineMs} ms`))
    }, this.#answerDeadlineMs).unref()
  }

  /** A worker that failed: what it was asked to sign is signed here, and the next batch starts a new one. */
  #retire(signing: SigningWorker | null, err: unknown): void {
    // Once: its own end (the terminate below, or the exit that an error ends in) reports it again.
    if (signing?.retired) return
    log.error('signing worker failed; signing on the main thread until a new one starts', errorFields(err))
    if (!signing || this.#worker === signing) {
      // A lone failure is retried with the next batch; one after another, after a wait.
      this.#failures++
      this.#nextStartAt = this.#failures < 2 ? 0 : this.#now() + Math.min(LAST_RETRY_MS, FIRST_RETRY_MS * 2 ** (this.#failures - 2))
    }
    if (!signing) return
    signing.retired = true
    signing.watchdog?.clear()
    if (this.#worker === signing) this.#worker = null
    for (const batch of signing.posted.splice(0)) for (const job of batch) signHere(job)
    signing.worker.terminate()
  }
}

/** A signing worker, the key ids it holds and its batches not answered yet, in the order it answers them. */
interface SigningWorker {
  worker: Worker
  known: Set<string>
  posted: Job[][]
  /** Set while a batch is out: fires when the oldest goes unanswered past the deadline. */
  watchdog: Deadline | null
  retired: boolean
}
