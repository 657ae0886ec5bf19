import type { Context } from '../context'
import { ApiError } from '../lib/errors'
import { characters, STORABLE } from '../lib/model'
import { addCredits, createAccount, createApiKey, revokeApiKey } from '../accounts/service'
import { createApplication, UUID } from '../apps/service'
import { type CommandName, OperatorError, parseInvocation, quoted, UsageError } from './args'
import { listAccounts, listApps } from './lists'

/**
 * The operator commands, typed and run in one place: the CLI runs them itself or hands the argv to a
 * running embedded server over its unix socket, and both paths end here.
 */

export { OperatorError } from './args'

/** Commands that work on the stored data: run by the CLI directly or by a running server for it. */
export type DataCommand =
  | { kind: 'account create'; name: string; credits: number }
  | { kind: 'account credits'; accountId: string; add: number }
  | { kind: 'account list'; limit: number }
  | { kind: 'apikey create'; accountId: string }
  | { kind: 'apikey revoke'; key: string }
  | { kind: 'app create'; accountId: string; name: string; sandbox: boolean }
  | { kind: 'app list'; accountId: string | null; limit: number }

/** Replaces the key a running server holds in memory: only ever run by the CLI, with no server up. */
export interface RotateCommand {
  kind: 'master-key rotate'
}

export type OperatorCommand = DataCommand | RotateCommand

/** A command line asks for help (text to print) or names a command. */
export type ParsedLine = { help: string } | { command: OperatorCommand }

const API_KEY = /^svc_live_[A-Za-z0-9_-]{16,128}$/
const DEFAULT_LIMIT = 100
const MAX_LIMIT = 10_000

function integer(command: CommandName, flag: string, text: string, min: number, max = Number.MAX_SAFE_INTEGER): number {
  const n = /^-?\d+$/.test(text.trim()) ? Number(text.trim()) : Number.NaN
  if (Number.isNaN(n)) throw new UsageError(`--${flag} must be a whole number, got ${quoted(text)}`, command)
  // Both bounds named: "of at least -9007199254740991" was the answer to 9007199254740992 too.
  if (!Number.isSafeInteger(n) || n < min || n > max)
    throw new UsageError(`--${flag} must be a whole number from ${min} to ${max}, got ${quoted(text)}`, command)
  return n
}

function name(command: CommandName, text: string): string {
  const trimmed = text.trim()
  // No command line carries these; a request made by hand on the operator socket can.
  if (!STORABLE.test(trimmed)) throw new UsageError('--name must not contain NUL characters or unpaired surrogates', command)
  const length = characters(trimmed)
  if (length < 1 || length > 128) throw new UsageError('--name must be 1 to 128 characters', command)
  return trimmed
}

function accountId(command: CommandName, text: string): string {
  if (!UUID.test(text)) throw new UsageError(`--account must be an account id (a UUID), got ${quoted(text)}`, command)
  return text.toLowerCase()
}

const limit = (command: CommandName, text: string | undefined) =>
  text === undefined ? DEFAULT_LIMIT : integer(command, 'limit', text, 1, MAX_LIMIT)

/** Validates the whole command line before anything is opened, so bad input never touches storage. */
export function parseCommand(argv: readonly string[]): ParsedLine {
  const line = parseInvocation(argv)
  if ('help' in line) return line
  const kind = line.command
  // parseInvocation has checked that required flags are there and that value flags carry text.
  const text = (flag: string) => line.flags.get(flag) as string | undefined
  const required = (flag: string) => text(flag) as string
  const command = ((): OperatorCommand => {
    switch (kind) {
      case 'account create': {
        const credits = text('credits')
        return { kind, name: name(kind, required('name')), credits: credits === undefined ? 0 : integer(kind, 'credits', credits, 0) }
      }
      case 'account credits':
        // A negative amount takes credits away (never below zero): how an operator corrects a mistake.
        return {
          kind,
          accountId: accountId(kind, required('account')),
          add: integer(kind, 'add', required('add'), Number.MIN_SAFE_INTEGER),
        }
      case 'account list':
        return { kind, limit: limit(kind, text('limit')) }
      case 'apikey create':
        return { kind, accountId: accountId(kind, required('account')) }
      case 'apikey revoke': {
        const key = required('key').trim()
        if (!API_KEY.test(key)) throw new UsageError('--key must be an API key shaped svc_live_<opaque>', kind)
        return { kind, key }
      }
      case 'app create':
        return {
          kind,
          accountId: accountId(kind, required('account')),
          name: name(kind, required('name')),
          sandbox: line.flags.get('sandbox') === true,
        }
      case 'app list': {
        const account = text('account')
        return { kind, accountId: account === undefined ? null : accountId(kind, account), limit: limit(kind, text('limit')) }
      }
      case 'master-key rotate':
        return { kind }
    }
  })()
  return { command }
}

/** Runs one command; storage answers like "no such account" come back as OperatorError. */
export async function runCommand(ctx: Context, command: DataCommand): Promise<Record<string, unknown>> {
  try {
    switch (command.kind) {
      case 'account create':
        return await createAccount(ctx, command.name, command.credits)
      case 'account credits':
        return await addCredits(ctx, command.accountId, command.add)
      case 'account list':
        return await listAccounts(ctx, command.limit)
      case 'apikey create':
        return { apiKey: await createApiKey(ctx, command.accountId) }
      case 'apikey revoke':
        if (!(await revokeApiKey(ctx, command.key))) throw new OperatorError('no live API key matches --key')
        return { ok: true }
      case 'app create': {
        const app = await createApplication(ctx, command.accountId, command.name, command.sandbox)
        return { appId: app.appId, appSecret: app.appSecret, publicKey: app.publicKey, keyId: app.keyId }
      }
      case 'app list':
        return await listApps(ctx, command.accountId, command.limit)
    }
  } catch (err) {
    if (err instanceof ApiError && err.status < 500) throw new OperatorError(err.message)
    throw err
  }
}
