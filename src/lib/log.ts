/**
 * One JSON line per entry on stderr, written by pino. Callers never pass secrets: keys, tokens and
 * bodies stay out. Redaction is the second line of defence: a field whose name says secret prints
 * [Redacted] at the top level and two levels down. Errors go through errorFields, which keeps what names a
 * failure and drops what carries data.
 */
import { format } from 'node:util'
import pino, { type DestinationStream, type Logger } from 'pino'

export type LogLevel = 'debug' | 'info' | 'warn' | 'error'

/** No log line is longer than this many characters. */
export const MAX_LOG_LINE = 4096
const MAX_FIELD = 512

/** Field names that hold secrets or personal identifiers wherever they appear (bodies, headers, rows). */
const SECRET_NAMES = [
  'authorization',
  'cookie',
  'apiKey',
  'api_key',
  'appSecret',
  'app_secret',
  'secret',
  'secretHash',
  'webhookSecret',
  'licenseKey',
  'license_key',
  'licenseKeys',
  'hwid',
  'hwids',
  'sessionToken',
  'session_token',
  'token',
  'password',
  'masterKey',
  'master_key',
  'privateKey',
  'private_key',
  'signingKey',
  'sealed',
  'payload',
  'signature',
  'nonce',
]
/** Hyphenated header names, matched as sent (lower case). */
const SECRET_HEADERS = ['x-api-key', 'set-cookie', 'proxy-authorization']
const SECRETS = new Set([...SECRET_NAMES, ...SECRET_HEADERS])
const CENSOR = '[Redacted]'
/** Levels walked: the top, and two down (an error's cause, a request's header map, a row in a list). */
const REDACT_DEPTH = 3

/**
 * The entry with every field named like a secret replaced, down to REDACT_DEPTH levels, arrays
 * included. Copies only what it changes, so the caller's objects stay as they were and a flat entry
 * (the access line) costs one Set lookup per field, where pino's 90 wildcard paths cost ~100 µs a line.
 */
function redacted<T>(value: T, depth: number): T {
  if (depth === 0 || typeof value !== 'object' || value === null) return value
  if (Array.isArray(value)) {
    let copy: unknown[] | null = null
    for (let i = 0; i < value.length; i++) {
      const item = redacted(value[i], depth - 1)
      if (item !== value[i]) (copy ??= value.slice())[i] = item
    }
    return (copy ?? value) as T
  }
  let copy: Record<string, unknown> | null = null
  for (const key in value) {
    const field = (value as Record<string, unknown>)[key]
    const next = SECRETS.has(key) ? CENSOR : redacted(field, depth - 1)
    if (next !== field) (copy ??= { ...(value as Record<string, unknown>) })[key] = next
  }
  return (copy ?? value) as T
}

const cut = (text: string, max: number) => (text.length > max ? `${text.slice(0, max)}…` : text)

/**
 * Keeps every line under MAX_LOG_LINE after redaction: long string fields are cut first; a line still
 * too long keeps its time, level, message and request id, and says it was truncated. Only an
 * oversized line is parsed again, so the usual line costs one length check.
 */
function capped(destination: DestinationStream): DestinationStream {
  return {
    write(line: string) {
      if (line.length <= MAX_LOG_LINE + 1) return destination.write(line)
      const entry = JSON.parse(line) as Record<string, unknown>
      const short: Record<string, unknown> = {}
      for (const [name, value] of Object.entries(entry)) short[name] = typeof value === 'string' ? cut(value, MAX_FIELD) : value
      let text = JSON.stringify(short)
      if (text.length > MAX_LOG_LINE) {
        const { time, level, requestId, msg } = short
        text = JSON.stringify({ time, level, requestId, msg, truncated: true })
      }
      destination.write(`${text}\n`)
    },
  }
}

function createLogger(destination: DestinationStream, level: LogLevel): Logger {
  return pino(
    {
      level,
      // No pid or hostname on each line: the process index is logged where it matters.
      base: undefined,
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }), log: (entry) => redacted(entry, REDACT_DEPTH) },
    },
    capped(destination),
  )
}

// Synchronous: a line logged just before process.exit (a failed start, an uncaught error) is written
// before the process ends, which an asynchronous buffer would lose.
const stderr = () => pino.destination({ dest: 2, sync: true })
let logger = createLogger(stderr(), 'info')

export function setLogLevel(level: LogLevel): void {
  logger.level = level
}

/** Sends the lines elsewhere (a test reads them), or back to stderr without one; the level is kept. */
export function setLogDestination(destination: DestinationStream = stderr()): void {
  logger = createLogger(destination, logger.level as LogLevel)
}

/** Whether a line at `level` would be written: lets a caller skip building its fields. */
export const logs = (level: LogLevel): boolean => logger.isLevelEnabled(level)

// The message goes in with the fields, ahead of them, so a line reads time, level, msg, fields as it did
// before pino (which otherwise writes msg last) and what matches `"msg":"listening","url"` still does.
export const log = {
  debug: (msg: string, fields?: Record<string, unknown>) => logger.debug({ msg, ...fields }),
  info: (msg: string, fields?: Record<string, unknown>) => logger.info({ msg, ...fields }),
  warn: (msg: string, fields?: Record<string, unknown>) => logger.warn({ msg, ...fields }),
  error: (msg: string, fields?: Record<string, unknown>) => logger.error({ msg, ...fields }),
}

/** How often one message logged through `logEvery` may appear. */
export const REPEAT_EVERY_MS = 10_000
const lastLogged = new Map<string, number>()

/**
 * For failures that repeat on every request or retry while something is down: one line per message
 * every REPEAT_EVERY_MS says the same, where a line each time would bury the rest of the log.
 */
export function logEvery(level: LogLevel, msg: string, fields?: () => Record<string, unknown>): void {
  if (!logger.isLevelEnabled(level)) return
  const now = Date.now()
  const since = now - (lastLogged.get(msg) ?? Number.NEGATIVE_INFINITY)
  // A negative time since is a clock stepped back: held back by it, every repeat went unlogged for the step's length.
  if (since >= 0 && since < REPEAT_EVERY_MS) return
  lastLogged.set(msg, now)
  log[level](msg, fields?.())
}

/** How long the other requests one error fails are gathered before the line that names them. */
export const SAME_ERROR_GATHER_MS = 1000
const MAX_IDS_NAMED = 50

interface Repeats {
  requestIds: string[]
  more: number
}
const reported = new WeakMap<object, Repeats | null>()

/**
 * Logs an error once however many requests it fails: when several callers are rejected with one
 * shared error object, only the first logs it with its details. The others' request ids (from
 * `fields.requestId`) follow on one line SAME_ERROR_GATHER_MS later, so each request's id is in the log.
 */
export function logErrorOnce(msg: string, err: unknown, fields?: Record<string, unknown>): void {
  if (typeof err === 'object' && err !== null) {
    if (reported.has(err)) return repeated(msg, err, fields?.requestId)
    reported.set(err, null)
  }
  log.error(msg, { ...fields, ...errorFields(err) })
}

function repeated(msg: string, err: object, requestId: unknown): void {
  if (typeof requestId !== 'string') return
  let repeats = reported.get(err)
  if (!repeats) {
    const gathered: Repeats = { requestIds: [], more: 0 }
    reported.set(err, gathered)
    setTimeout(() => {
      reported.set(err, null)
      log.error(`${msg}: the same error failed these requests too`, { ...gathered })
    }, SAME_ERROR_GATHER_MS).unref()
    repeats = gathered
  }
  if (repeats.requestIds.length < MAX_IDS_NAMED) repeats.requestIds.push(requestId)
  else repeats.more++
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
  if (typeof err === 'string') return { error: 'string', message: safeMessage(err) }
  if (typeof err === 'object' && err !== null && !(err instanceof Error)) {
    // Thrown without being an Error (PGlite's file system throws { name: 'ErrnoError', errno }: a full
    // disk): its name and codes say what failed, where `object` alone said nothing.
    const thrown = err as Record<string, unknown>
    const fields: Record<string, unknown> = { error: typeof thrown.name === 'string' && IDENTIFIER.test(thrown.name) ? thrown.name : 'object' }
    if (Number.isSafeInteger(thrown.errno)) fields.errno = thrown.errno
    if (typeof thrown.code === 'string' && SQLSTATE_OR_ERRNO.test(thrown.code)) fields.code = thrown.code
    return fields
  }
  if (!(err instanceof Error)) return { error: typeof err }
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

/**
 * What a library writes to the console goes through the log instead (ioredis warns of a password its
 * Redis does not need): the server's log stays one JSON line per entry, and the CLI, logging errors
 * only, keeps stderr to its one error line.
 */
export function logLibraryOutput(): void {
  console.warn = (...args: unknown[]) => log.warn('a library warned', { text: format(...args) })
  console.error = (...args: unknown[]) => log.error('a library reported an error', { text: format(...args) })
}
