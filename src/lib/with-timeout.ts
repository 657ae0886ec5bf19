const TIMED_OUT = Symbol('timed out')

/** What `work` settles to, or TIMED_OUT once `ms` passed first (the work itself runs on). */
async function race<T>(work: Promise<T>, ms: number): Promise<T | typeof TIMED_OUT> {
  let timer: ReturnType<typeof setTimeout> | undefined
  const timeout = new Promise<typeof TIMED_OUT>((resolve) => {
    timer = setTimeout(() => resolve(TIMED_OUT), ms)
  })
  try {
    return await Promise.race([work, timeout])
  } finally {
    clearTimeout(timer)
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
