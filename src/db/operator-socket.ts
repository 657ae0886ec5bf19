import { existsSync } from 'node:fs'
import { join } from 'node:path'

/** Where a running server takes operator commands; the CLI derives the same path from DATA_DIR. */
export const operatorSocketPath = (dataDir: string) => join(dataDir, 'operator.sock')

/** Connection failures that prove no server listens on a socket; any other outcome may be a live one. */
export const NO_SERVER = new Set(['ENOENT', 'ECONNREFUSED', 'ConnectionRefused', 'FailedToOpenSocket'])

/** A server starting up listens before it opens the database, and answers any request at once. */
export const PROBE_MS = 5_000

/**
 * What the operator socket does within PROBE_MS: a server answers, none is there (the socket missing or
 * refused), or one stays silent: stopped (SIGSTOP) or hung, yet still accepting connections.
 */
export async function probeOperatorSocket(path: string): Promise<'answers' | 'none' | 'silent'> {
  if (!existsSync(path)) return 'none'
  try {
    const res = await fetch('http://localhost/', { unix: path, signal: AbortSignal.timeout(PROBE_MS) })
    await res.body?.cancel()
    return 'answers'
  } catch (err) {
    return NO_SERVER.has((err as { code?: string }).code ?? '') ? 'none' : 'silent'
  }
}

/**
 * Whether a server answers on the operator socket. Only a refused or missing socket counts as none:
 * a timeout or another failure may be a live server, and the callers refuse then.
 */
export const operatorSocketAnswers = async (path: string): Promise<boolean> => (await probeOperatorSocket(path)) !== 'none'
