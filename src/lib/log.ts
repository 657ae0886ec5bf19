/**
 * One JSON line per entry on stderr. Callers never pass secrets: keys, tokens and bodies stay out.
 * Errors go through errorFields, which keeps what names a failure and drops what carries data.
 */
const LEVELS = { debug: 10, info: 20, warn: 30, error: 40 } as const
export type LogLevel = keyof typeof LEVELS

/** No log line is longer than this many characters. */
export const MAX_LOG_LINE = 4096
const MAX_FIELD = 512

let threshold: number = LEVELS.info

export function setLogLevel(level: LogLevel): void {
  threshold = LEVELS[level]
}

const cut = (text: string, max: number) => (text.length > max ? `${text.slice(0, max)}…` : text)

function write(level: LogLevel, msg: string, fields?: Record<string, unknown>): void {
  if (LEVELS[level] < threshold) return
  const time = new Date().toISOString()
  let line = JSON.stringify({ time, level, msg, ...fields })
  if (line.length > MAX_LOG_LINE) {
    const short: Record<string, unknown> = {}
    for (const [name, value] of Object.entries(fields ?? {}))
      short[name] = typeof value === 'string' ? cut(value, MAX_FIELD) : value
    line = JSON.stringify({ time, level, msg: cut(msg, MAX_FIELD), ...short })
    if (line.length > MAX_LOG_LINE)
      line = JSON.stringify({ time, level, msg: cut(msg, MAX_FIELD), truncated: true })
  }
  process.stderr.write(`${line}\n`)
}

export const log = {
  debug: (msg: string, fields?: Record<string, unknown>) => write('debug', msg, fields),
  info: (msg: string, fields?: Record<string, unknown>) => write('info', msg, fields),
  warn: (msg: string, fields?: Record<string, unknown>) => write('warn', msg, fields),
  error: (msg: string, fields?: Record<string, unknown>) => write('error', msg, fields),
}

/** How often one message logged through `logEvery` may appear. */
export const REPEAT_EVERY_MS = 10_000
const lastLogged = new Map<string, number>()

/**
 * For failures that repeat on every request or retry while something is down: one line per message
 * every REPEAT_EVERY_MS says the same, where a line each time would bury the rest of the log.
 */
export function logEvery(level: LogLevel, msg: string, fields?: () => Record<string, unknown>): void {
  if (LEVELS[level] < threshold) return
  const now = Date.now()
  if (now - (lastLogged.get(msg) ?? Number.NEGATIVE_INFINITY) < REPEAT_EVERY_MS) return
  lastLogged.set(msg, now)
  write(level, msg, fields?.())
}

const reported = new WeakSet<object>()

/**
 * Logs an error once however many requests it fails: when several callers are rejected with one
 * shared error object, only the first logs it.
 */
export function logErrorOnce(msg: string, err: unknown, fields?: Record<string, unknown>): void {
  if (typeof err === 'object' && err !== null) {
    if (reported.has(err)) return
    reported.add(err)
  }
  log.error(msg, { ...fields, ...errorFields(err) })
}

// Names a database error attaches (PGlite spells them short, postgres.js with `_name`): identifiers
// from the schema, never row data. `detail`, `where`, `query` and the parameters are left behind.
const NAMES = [
  ['schema', 'schema_name'],
  ['table', 'table_name'],
  ['column', 'column_name'],
  ['constraint', 'constraint_name'],
] as const
const SQLSTATE_OR_ERRNO = /^[A-Z0-9_]{1,40}$/
const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_$]{0,62}$/
const MAX_FRAMES = 8
const MAX_CAUSES = 3

/**
 * What a message may keep. Drizzle's query errors embed the statement and every parameter after
 * "Failed query:", so only those two words stay. PostgreSQL and the JSON parser quote the offending
 * value ("invalid input syntax for type uuid: \"…\""), so quoted text goes; so do long opaque
 * tokens (keys, hashes, secrets) that a message might carry unquoted.
 */
function safeMessage(message: string): string {
  if (message.startsWith('Failed query:')) return 'Failed query'
  return cut(
    message
      .replace(/"(?:[^"\\]|\\.)*"/g, '"…"')
      .replace(/\((?:[^()]*)\)=\((?:[^()]|\([^()]*\))*\)/g, '(…)=(…)')
      .replace(/[A-Za-z0-9_+/=-]{16,}/g, (token) => (/\d/.test(token) && /[A-Za-z]/.test(token) ? '…' : token)),
    MAX_FIELD,
  )
}

function className(err: Error): string {
  // DrizzleQueryError keeps Error's name; PGlite's minified class names itself "error".
  const name = err.name !== 'Error' ? err.name : (err.constructor?.name ?? err.name)
  return IDENTIFIER.test(name) ? name : 'Error'
}

/** The stack's frames: its first lines repeat the message, which is sanitised on its own. */
function frames(stack: string | undefined): string | undefined {
  const at = stack?.split('\n').filter((line) => line.startsWith('    at ')).slice(0, MAX_FRAMES)
  return at?.length ? at.map((line) => cut(line.trim(), 200)).join('\n') : undefined
}

function describe(err: unknown, depth: number): Record<string, unknown> {
  if (!(err instanceof Error)) {
    return typeof err === 'string' ? { error: 'string', message: safeMessage(err) } : { error: typeof err }
  }
  const attached = err as unknown as Record<string, unknown>
  const fields: Record<string, unknown> = { error: className(err), message: safeMessage(err.message) }
  if (typeof attached.code === 'string' && SQLSTATE_OR_ERRNO.test(attached.code)) fields.code = attached.code
  for (const [name, long] of NAMES) {
    // Bun puts a numeric `column` (of the source line) on every error: only a string is a name.
    const value = [attached[long], attached[name]].find((v) => typeof v === 'string' && IDENTIFIER.test(v))
    if (value !== undefined) fields[name] = value
  }
  const stack = frames(err.stack)
  if (stack) fields.stack = stack
  if (err.cause !== undefined && depth < MAX_CAUSES) fields.cause = describe(err.cause, depth + 1)
  return fields
}

/**
 * Error details safe for a log line: class, message without values, SQLSTATE or errno code, the
 * schema names a database error carries, stack frames and the same for each cause. Nothing else
 * attached to the error object: drivers hang the statement, its parameters and the row on it.
 */
export function errorFields(err: unknown): Record<string, unknown> {
  return describe(err, 0)
}
