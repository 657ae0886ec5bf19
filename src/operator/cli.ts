/**
 * Operator CLI: `bun run cli <command> [flags]`. Prints one JSON object on the last line of stdout and
 * exits 0; on bad input prints one line on stderr and exits non-zero. Same settings as the server.
 */
import { existsSync } from 'node:fs'
import { buildContext } from '../boot'
import { ConfigError, loadConfig } from '../config'
import { describeHolder, isLock, LOCK_WAIT_MS, lockDataDir } from '../db/data-dir-lock'
import {
  OperatorError,
  type OperatorCommand,
  parseCommand,
  runCommand,
  USAGE,
} from './commands'
import { type OperatorReply, operatorSocketPath, usesOperatorSocket } from './socket'
import { errorFields, setLogLevel } from '../lib/log'

class CliError extends Error {}

// Connection failures that prove no server listens: only then may the CLI open the database itself.
const NO_SERVER = new Set(['ENOENT', 'ECONNREFUSED', 'ConnectionRefused', 'FailedToOpenSocket'])

/** The running server's answer, or null when no server listens on the socket. */
async function viaServer(socket: string, argv: string[]): Promise<Record<string, unknown> | null> {
  if (!existsSync(socket)) return null
  let res: Response
  try {
    res = await fetch('http://localhost/run', {
      unix: socket,
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ argv }),
    })
  } catch (err) {
    if (NO_SERVER.has((err as { code?: string }).code ?? '')) return null
    throw err
  }
  const reply = (await res.json()) as OperatorReply
  if (res.status === 400) throw new CliError(reply.error ?? 'bad input')
  if (!res.ok || !reply.result) throw new Error(reply.error ?? `the server answered ${res.status}`)
  return reply.result
}

async function direct(config: ReturnType<typeof loadConfig>, command: OperatorCommand) {
  const ctx = await buildContext(config)
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
 * DATA_DIR lock so no server starts on the database meanwhile. A lock holder that does not answer
 * (another CLI, a server still starting) is waited for, briefly.
 */
async function viaServerOrLocked(config: ReturnType<typeof loadConfig>, command: OperatorCommand, argv: string[]) {
  const socket = operatorSocketPath(config.dataDir)
  let answer = await viaServer(socket, argv)
  if (answer) return answer
  const lock = await lockDataDir(config.dataDir, 'cli', LOCK_WAIT_MS, async () => {
    answer = await viaServer(socket, argv)
    return answer === null
  })
  if (answer) return answer
  if (!isLock(lock)) throw new CliError(`${describeHolder(config.dataDir, lock)} and its operator socket does not answer`)
  try {
    return await direct(config, command)
  } finally {
    lock.release()
  }
}

async function main(argv: string[]): Promise<number> {
  try {
    const config = loadConfig()
    // Stdout carries the answer and stderr the one error line: the server's start-up notes stay out.
    setLogLevel('error')
    const command = parseCommand(argv)
    const result = usesOperatorSocket(config)
      ? await viaServerOrLocked(config, command, argv)
      : await direct(config, command)
    process.stdout.write(`${JSON.stringify(result)}\n`)
    return 0
  } catch (err) {
    if (err instanceof ConfigError || err instanceof OperatorError || err instanceof CliError) {
      process.stderr.write(`error: ${err.message.replaceAll('\n', ' ')}\n`)
      return 2
    }
    const fields = errorFields(err)
    process.stderr.write(`error: ${String(fields.message ?? fields.error).replaceAll('\n', ' ')}\n`)
    return 1
  }
}

const args = process.argv.slice(2)
if (args[0] === '--help' || args[0] === 'help') {
  process.stdout.write(`${JSON.stringify({ usage: USAGE.map((u) => `bun run cli ${u}`) })}\n`)
  process.exit(0)
}
process.exit(await main(args))
