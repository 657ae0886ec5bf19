/** One JSON line per entry on stderr. Callers never pass secrets: keys, tokens and bodies stay out. */
const LEVELS = { debug: 10, info: 20, warn: 30, error: 40 } as const
export type LogLevel = keyof typeof LEVELS

let threshold: number = LEVELS.info

export function setLogLevel(level: LogLevel): void {
  threshold = LEVELS[level]
}

function write(level: LogLevel, msg: string, fields?: Record<string, unknown>): void {
  if (LEVELS[level] < threshold) return
  const line = JSON.stringify({ time: new Date().toISOString(), level, msg, ...fields })
  process.stderr.write(`${line}\n`)
}

export const log = {
  debug: (msg: string, fields?: Record<string, unknown>) => write('debug', msg, fields),
  info: (msg: string, fields?: Record<string, unknown>) => write('info', msg, fields),
  warn: (msg: string, fields?: Record<string, unknown>) => write('warn', msg, fields),
  error: (msg: string, fields?: Record<string, unknown>) => write('error', msg, fields),
}

/** Error details safe for a log line: name, message and stack, nothing attached to the error object. */
export function errorFields(err: unknown): Record<string, unknown> {
  if (err instanceof Error) return { error: err.name, message: err.message, stack: err.stack }
  return { error: String(err) }
}
