/** What `work` resolves to, or null once `ms` passed first (the work itself runs on). */
export async function withTimeout<T>(work: Promise<T>, ms: number): Promise<T | null> {
  let timer: ReturnType<typeof setTimeout> | undefined
  const timeout = new Promise<null>((resolve) => {
    timer = setTimeout(() => resolve(null), ms)
  })
  try {
    return await Promise.race([work, timeout])
  } finally {
    clearTimeout(timer)
  }
}

/** What `work` resolves to, or a rejection once `ms` passed first (the work itself runs on). */
export function withDeadline<T>(work: Promise<T>, ms: number, what: string): Promise<T> {
  return new Promise((resolve, reject) => {
    const deadline = setTimeout(() => reject(new Error(`${what} did not finish within ${ms} ms`)), ms)
    work.then(
      (value) => {
        clearTimeout(deadline)
        resolve(value)
      },
      (err: unknown) => {
        clearTimeout(deadline)
        reject(err)
      },
    )
  })
}
