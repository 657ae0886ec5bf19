/**
 * Operator CLI: `bun run cli <command> [flags]`. Prints one JSON object on the last line of stdout and
 * exits 0, or help text for `--help`; a problem is one line on stderr and a non-zero exit (2 for bad
 * input or settings). Same settings as the server.
 */
import { buildContext } from '../boot'
import { ConfigError, loadConfig } from '../config'
import { describeHolder, isLock, isStopped, LOCK_WAIT_MS, lockDataDir, mayLetGo } from '../db/data-dir-lock'
import { type DataCommand, OperatorError, parseCommand, runCommand } from './commands'
import { type OperatorReply, settingsDigest, usesOperatorSocket } from './socket'
import { rotateMasterKey } from './rotate'
import { NO_SERVER, operatorSocketPath, PROBE_MS, probeOperatorSocket } from '../db/operator-socket'
import { Refused } from './args'
import { errorFields, logLibraryOutput, setLogLevel } from '../lib/log'
import { ResealRefused } from '../signing/reseal'
import { SealError } from '../lib/crypto'
import { codedError } from '../db/errors'

/**
 * The server took the command and dropped the connection before answering (a server stopping waits
 * for commands under way, but not for ever): the operator must not take it for a failure and run it
 * again, adding credits twice.
 */
const cutOff = (err: unknown) =>
  new Refused(`the server closed the connection before answering (${String(errorFields(err).message ?? 'no reason given')}): ${MAY_HAVE_RUN}`)
const MAY_HAVE_RUN = 'the command may have taken effect; check (account list, app list) before running it again'

/**
 * A connection lost with a statement on it, a COMMIT say, that PostgreSQL may have run: postgres.js's
 * codes for one that closed, and the socket's for one reset or timed out. A command run directly then
 * fails as one cut off from the server does. (A connection that never opened fails otherwise.)
 */
const LOST_WITH_A_STATEMENT = new Set(['CONNECTION_CLOSED', 'CONNECTION_DESTROYED', 'CONNECTION_STALLED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT'])

/**
 * The running server's answer; 'none' when no server listens on the socket, 'silent' when one accepts
 * connections but has not answered within PROBE_MS (the command is then not sent).
 */
async function viaServer(socket: string, argv: string[], settings: string): Promise<Record<string, unknown> | 'none' | 'silent'> {
  const probe = await probeOperatorSocket(socket)
  if (probe !== 'answers') return probe
  let res: Response
  try {
    res = await fetch('http://localhost/run', {
      unix: socket,
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ argv, settings }),
    })
  } catch (err) {
    // Only then may the CLI open the database itself.
    if (NO_SERVER.has((err as { code?: string }).code ?? '')) return 'none'
    throw cutOff(err)
  }
  // Refused unread (the socket's body limit): the command never ran.
  if (res.status === 413) throw new OperatorError('the command line is too long')
  const reply = (await res.json().catch((err: unknown) => {
    throw cutOff(err)
  })) as OperatorReply
  if (res.status === 400) throw new OperatorError(reply.error ?? 'bad input')
  if (!res.ok || !reply.result) throw new Refused(reply.error ?? `the server answered ${res.status}`)
  return reply.result
}

/**
 * How long a server of this namespace holding the DATA_DIR may take to answer on its socket: it listens
 * a moment after it takes the lock, so one silent this long never will.
 */
const SOCKET_WAIT_MS = 10_000

/** The storage did not open (or migrate): no command ran, whatever the connection's failure says. */
class StorageNotOpened extends Error {
  constructor(override readonly cause: unknown) {
    super('the storage did not open')
  }
}

async function direct(config: ReturnType<typeof loadConfig>, command: DataCommand) {
  const ctx = await buildContext(config, { command: true }).catch((err: unknown) => {
    throw new StorageNotOpened(err)
  })
  try {
    return await runCommand(ctx, command)
  } finally {
    await ctx.webhookPool.close()
    await ctx.store.close()
    await ctx.database.close()
  }
}

/**
 * Through the running server when one answers on the socket; otherwise directly, holding the
 * DATA_DIR lock so no server starts on the database meanwhile. A lock holder that does not answer is
 * waited for (LOCK_WAIT_MS at most): another CLI until it is done, a server of this namespace while it
 * may still be starting its socket, and one silent on it while it runs: a server listens before it opens
 * its database, and the embedded one's first initdb holds its thread for seconds (8-20 s on a busy
 * 2-core host), so a command typed as `npm start` came up was refused as if sent to a hung server.
 */
async function viaServerOrLocked(config: ReturnType<typeof loadConfig>, command: DataCommand, argv: string[]) {
  const socket = operatorSocketPath(config.dataDir)
  const settings = settingsDigest(config)
  let answer = await viaServer(socket, argv, settings)
  if (typeof answer === 'object') return answer
  const since = performance.now()
  const lock = await lockDataDir(config.dataDir, 'cli', LOCK_WAIT_MS, async (holder) => {
    if (isStopped(holder)) return false
    answer = await viaServer(socket, argv, settings)
    if (typeof answer === 'object') return false
    return answer === 'silent' || (await mayLetGo(holder)) || performance.now() - since < SOCKET_WAIT_MS
  })
  if (typeof answer === 'object') return answer
  if (!isLock(lock)) {
    if (answer === 'silent') {
      const waited = isStopped(lock) ? PROBE_MS : LOCK_WAIT_MS
      throw new Refused(`a server holds ${socket} but has not answered in ${waited / 1000} s: the command did not run`)
    }
    // A CLI serves no socket: only a server's silence is worth naming.
    throw new Refused(`${describeHolder(config.dataDir, lock)}${lock.owner === 'server' ? ' and its operator socket does not answer' : ''}`)
  }
  try {
    return await direct(config, command)
  } finally {
    lock.release()
  }
}

/** The one stderr line and the exit status for what went wrong. */
function failure(err: unknown, mayHaveRun = true): { line: string; code: number } {
  if (err instanceof StorageNotOpened) return failure(err.cause, false)
  if (err instanceof ConfigError || err instanceof OperatorError) return { line: err.message, code: 2 }
  // The service's own messages name paths and ids, never a secret: printed as they are.
  if (err instanceof Refused || err instanceof ResealRefused || err instanceof SealError) return { line: err.message, code: 1 }
  // A driver's error: its message without the values it may quote (errorFields), never a stack.
  const fields = errorFields(err)
  const line = String(fields.message ?? fields.error)
  return { line: mayHaveRun && LOST_WITH_A_STATEMENT.has(codedError(err)?.code ?? '') ? `${line}: ${MAY_HAVE_RUN}` : line, code: 1 }
}

async function main(argv: string[]): Promise<number> {
  try {
    // The command line before the settings: help and usage errors need no working environment.
    const line = parseCommand(argv)
    if ('help' in line) {
      process.stdout.write(line.help)
      return 0
    }
    const config = loadConfig()
    // Stdout carries the answer and stderr the one error line: the server's start-up notes stay out, and
    // so do a library's warnings.
    setLogLevel('error')
    logLibraryOutput()
    const { command } = line
    const result =
      command.kind === 'master-key rotate'
        ? await rotateMasterKey(config, process.env)
        : usesOperatorSocket(config)
          ? await viaServerOrLocked(config, command, argv)
          : await direct(config, command)
    process.stdout.write(`${JSON.stringify(result)}\n`)
    return 0
  } catch (err) {
    const { line, code } = failure(err)
    process.stderr.write(`error: ${line.replaceAll('\n', ' ')}\n`)
    return code
  }
}

process.exit(await main(process.argv.slice(2)))
