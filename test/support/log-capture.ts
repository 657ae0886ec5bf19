import { setLogDestination } from '../../src/lib/log'

/**
 * The entries the server logs while `fn` runs, parsed; stderr again afterwards. `into` receives each
 * entry as it is written, for a caller that waits for one.
 */
export async function loggedBy(fn: () => unknown, into: Record<string, any>[] = []): Promise<Record<string, any>[]> {
  setLogDestination({ write: (line: string) => into.push(JSON.parse(line)) })
  try {
    await fn()
  } finally {
    setLogDestination()
  }
  return into
}
