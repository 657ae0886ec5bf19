import { createHash } from 'node:crypto'
import { chmodSync, lstatSync, rmSync, statSync } from 'node:fs'
import { type Config, ConfigError } from '../config'
import { OperatorError, parseCommand, runCommand } from './commands'
import { MAX_COMMAND_LINE_BYTES } from './args'
import type { Context } from '../context'
import { errorFields, log } from '../lib/log'
import { withTimeout } from '../lib/with-timeout'
import { operatorSocketPath } from '../db/operator-socket'
import { makeDataDir } from '../db/data-dir'

/**
 * Whether a running server takes operator commands: when it holds state no other process can reach
 * (the embedded database admits one process; without Redis its caches learn of changes only from
 * inside). With PostgreSQL and Redis both shared, the CLI may work on them directly.
 */
export const usesOperatorSocket = (config: Pick<Config, 'databaseUrl' | 'redisUrl'>) =>
  !config.databaseUrl || !config.redisUrl

/** How long a stopping server waits for the operator commands under way before cutting them off. */
const STOP_WAIT_MS = 5000

const BODY_SHAPE = 'body must be JSON { argv: string[], settings: string }'

/** The most a command's request body may be: a command line the CLI accepts, and room to spare. */
const COMMAND_BYTES = 2 * MAX_COMMAND_LINE_BYTES

/**
 * What the CLI and the server it reaches must agree on: the storage a command works on, and the key
 * it is sealed with. A CLI that found a server on its DATA_DIR but names another database ran its
 * command there and reported success (an API key for a database the operator never meant). A digest:
 * the URLs carry passwords, and the key is a secret.
 */
export const settingsDigest = (config: Pick<Config, 'databaseUrl' | 'redisUrl' | 'masterKey'>) =>
  createHash('sha256')
    .update(JSON.stringify([config.databaseUrl, config.redisUrl, config.masterKey?.toString('hex') ?? null]))
    .digest('hex')

const START_FAILED = 'the server on this DATA_DIR failed to start (its log says why): the command did not run'

const OTHER_SETTINGS =
  'the server on this DATA_DIR runs with another DATABASE_URL, REDIS_URL or MASTER_KEY than this CLI: run the CLI with the server\'s settings'

/** The socket's one request: POST /run with `{ argv, settings }` (settingsDigest); 200 `{ result }`, 400, 500 or 503 `{ error }`. */
export interface OperatorReply {
  result?: Record<string, unknown>
  error?: string
}

async function handle(contextReady: Promise<Context>, settings: string, request: Request): Promise<Response> {
  const url = new URL(request.url)
  if (request.method !== 'POST' || url.pathname !== '/run')
    return Response.json({ error: 'not found' }, { status: 404 })
  let body: { argv?: unknown; settings?: unknown } | null
  try {
    body = (await request.json()) as typeof body
  } catch {
    return Response.json({ error: BODY_SHAPE }, { status: 400 })
  }
  const argv = body?.argv
  if (!Array.isArray(argv) || !argv.every((a) => typeof a === 'string')) {
    return Response.json({ error: BODY_SHAPE }, { status: 400 })
  }
  if (body?.settings !== settings) return Response.json({ error: OTHER_SETTINGS } satisfies OperatorReply, { status: 400 })
  try {
    const line = parseCommand(argv)
    // The CLI prints help itself, and rotates only with no server holding the old key in memory.
    if ('help' in line) throw new OperatorError('help is printed by the CLI, not the server')
    const { command } = line
    if (command.kind === 'master-key rotate') throw new OperatorError('master-key rotate runs with the server stopped')
    // The command's name only: its flags carry names and keys that have no place in a log.
    log.info('operator command', { command: command.kind })
    const ctx = await contextReady.catch(() => null)
    // The start failed (the server exits with its reason): the command never ran, and the CLI must not
    // tell the operator it may have.
    if (!ctx) return Response.json({ error: START_FAILED } satisfies OperatorReply, { status: 503 })
    const result = await runCommand(ctx, command)
    return Response.json({ result } satisfies OperatorReply)
  } catch (err) {
    if (err instanceof OperatorError)
      return Response.json({ error: err.message } satisfies OperatorReply, { status: 400 })
    log.error('operator command failed', errorFields(err))
    return Response.json(
      { error: 'the server failed to run the command; see its log' } satisfies OperatorReply,
      {
        status: 500,
      },
    )
  }
}

/**
 * Serves operator commands on DATA_DIR/operator.sock (mode 0600: only the server's own user may
 * provision) with the server's own ctx. An embedded database admits one process, and in-process
 * caches learn of changes only from inside: so the CLI goes through here while the server runs.
 * Commands that arrive while `contextReady` is pending (migrations at start) wait for it. The caller
 * holds the DATA_DIR lock (src/db/data-dir-lock.ts).
 */
export function startOperatorSocket(config: Readonly<Config>, contextReady: Promise<Context>): { stop(): Promise<void> } {
  const path = operatorSocketPath(config.dataDir)
  const settings = settingsDigest(config)
  makeDataDir(config.dataDir)
  // The caller holds the DATA_DIR lock, so a socket here is a dead server's, and cannot be listened on.
  // Anything else there is someone's file or directory: not ours to delete.
  const found = lstatSync(path, { throwIfNoEntry: false })
  if (found && !found.isSocket()) {
    throw new ConfigError(`${path} is a ${found.isDirectory() ? 'directory' : 'file'}, not a socket: move it out of DATA_DIR`)
  }
  rmSync(path, { force: true })
  // The umask makes the socket 0600 from its first instant; the chmod states it for the record.
  const previous = process.umask(0o177)
  let server: ReturnType<typeof Bun.serve>
  try {
    // A command line is short: a body of megabytes (tens of millions of argv entries) held the server's
    // event loop for seconds while it was parsed. Bun answers 413 past this.
    server = Bun.serve({ unix: path, maxRequestBodySize: COMMAND_BYTES, fetch: (request) => handle(contextReady, settings, request) })
  } finally {
    process.umask(previous)
  }
  chmodSync(path, 0o600)
  const created = statSync(path).ino
  log.info('operator socket listening', { path })
  return {
    async stop() {
      // The commands under way finish first (the database closes after this). Cut off, one still
      // committed while its CLI reported a failure: retried, credits were added twice; an account
      // created so lost its only API key.
      if ((await withTimeout(server.stop(), STOP_WAIT_MS)) === null) await server.stop(true)
      // Only the socket this server created: whatever replaced it belongs to someone else.
      if (statSync(path, { throwIfNoEntry: false })?.ino === created) rmSync(path, { force: true })
    },
  }
}
