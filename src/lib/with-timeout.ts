const TIMED_OUT = Symbol('timed out')

/**
 * A timer that fires this much past its time found the event loop held (a long collection, a host that
 * paused the process), and gives what came meanwhile as long again to be read.
 */
const HELD_MS = 20

/**
 * Calls `expire` once `ms` have passed and the event loop has since read what its sockets and workers
 * hold: a deadline for an answer. A bare timer fires first when the loop wakes from a stall longer than
 * `ms`, so an answer that came during the stall, waiting in a socket's buffer, was taken for none: a
 * Redis that had answered was treated as stalled, and its shard's requests failed.
 */
export class Deadline {
  #timer: ReturnType<typeof setTimeout> | null = null
  #immediate: ReturnType<typeof setImmediate> | null = null
  #unref = false

  constructor(expire: () => void, ms: number) {
    const due = performance.now() + ms
    this.#arm(ms, () => {
      if (performance.now() - due > HELD_MS) this.#arm(HELD_MS, () => this.#afterIo(expire))
      else this.#afterIo(expire)
    })
  }

  #arm(ms: number, fire: () => void): void {
    this.#timer = setTimeout(() => {
      this.#timer = null
      fire()
    }, ms)
    if (this.#unref) this.#timer.unref()
  }

  /** After the next poll for I/O: its answers come first. */
  #afterIo(expire: () => void): void {
    this.#immediate = setImmediate(expire)
  }

  /** The deadline will not expire (the answer came). */
  clear(): void {
    if (this.#timer) clearTimeout(this.#timer)
    if (this.#immediate) clearImmediate(this.#immediate)
  }

  /** A pending deadline does not keep the process alive. */
  unref(): this {
    this.#unref = true
    this.#timer?.unref()
    return this
  }
}

/** What `work` settles to, or TIMED_OUT once `ms` passed first (the work itself runs on). */
async function race<T>(work: Promise<T>, ms: number): Promise<T | typeof TIMED_OUT> {
  let deadline: Deadline | undefined
  const timeout = new Promise<typeof TIMED_OUT>((resolve) => {
    deadline = new Deadline(() => resolve(TIMED_OUT), ms)
  })
  try {
    return await Promise.race([work, timeout])
  } finally {
    deadline?.clear()
  }
}

/** What `work` resolves to, or null once `ms` passed first (the work itself runs on). */
export async function withTimeout<T>(work: Promise<T>, ms: number): Promise<T | null> {
  const result = await race(work, ms)
  return result === TIMED_OUT ? null : result
}

/** What a call that did not finish by its deadline fails with: whoever it waited on is not answering. */
export class DeadlineExceeded extends Error {}

/**
 * What `work` resolves to, or a DeadlineExceeded naming `what` once `ms` passed first (the work itself
 * runs on; `late` is told it did).
 */
export async function withDeadline<T>(work: Promise<T>, ms: number, what: string, late?: () => void): Promise<T> {
  const result = await race(work, ms)
  if (result === TIMED_OUT) {
    late?.()
    throw new DeadlineExceeded(`${what} did not finish within ${ms} ms`)
  }
  return result
}
