/**
 * The value of the one sample in a Prometheus exposition whose name and labels start with `prefix`.
 * Throws when there is none: a missing series must not pass for a zero.
 */
export function sample(text: string, prefix: string): number {
  const line = text.split('\n').find((l) => l.startsWith(prefix))
  if (line === undefined) throw new Error(`no sample ${prefix} in the exposition`)
  return Number(line.slice(line.lastIndexOf(' ') + 1))
}

/**
 * A counter read before (or while waiting for) what it counts: a labelled series appears with its
 * first count, so absence reads 0 here, and only here.
 */
export function countSoFar(text: string, prefix: string): number {
  return text.split('\n').some((l) => l.startsWith(prefix)) ? sample(text, prefix) : 0
}
