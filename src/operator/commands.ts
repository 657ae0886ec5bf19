import type { Context } from '../context'
import { ApiError } from '../lib/errors'
import { addCredits, createAccount, createApiKey, revokeApiKey } from '../accounts/service'
import { createApplication, UUID } from '../apps/service'

/**
 * The operator commands, parsed and run in one place: the CLI runs them itself or hands the argv to a
 * running embedded server over its unix socket, and both paths end here.
 */

/** Bad input: the CLI prints the message as its one stderr line and exits non-zero. */
export class OperatorError extends Error {}

export type OperatorCommand =
  | { kind: 'account create'; name: string; credits: number }
  | { kind: 'account credits'; accountId: string; add: number }
  | { kind: 'apikey create'; accountId: string }
  | { kind: 'apikey revoke'; key: string }
  | { kind: 'app create'; accountId: string; name: string; sandbox: boolean }

export const USAGE = [
  'account create --name <name> [--credits <n>]',
  'account credits --account <accountId> --add <n>',
  'apikey create --account <accountId>',
  'apikey revoke --key <apiKey>',
  'app create --account <accountId> --name <name> [--sandbox]',
]

interface Spec {
  /** Flags taking a value; true marks required ones. */
  values: Record<string, boolean>
  switches: string[]
}

const SPECS: Record<OperatorCommand['kind'], Spec> = {
  'account create': { values: { name: true, credits: false }, switches: [] },
  'account credits': { values: { account: true, add: true }, switches: [] },
  'apikey create': { values: { account: true }, switches: [] },
  'apikey revoke': { values: { key: true }, switches: [] },
  'app create': { values: { account: true, name: true }, switches: ['sandbox'] },
}

const API_KEY = /^svc_live_[A-Za-z0-9_-]{16,128}$/

function flags(kind: OperatorCommand['kind'], args: string[]): Map<string, string | true> {
  const spec = SPECS[kind]
  const out = new Map<string, string | true>()
  for (let i = 0; i < args.length; i++) {
    const arg = args[i] ?? ''
    const m = /^--([a-z]+)(?:=(.*))?$/s.exec(arg)
    if (!m?.[1])
      throw new OperatorError(`unexpected argument "${arg}"; usage: ${kind} ${usageOf(kind)}`)
    const name = m[1]
    if (out.has(name)) throw new OperatorError(`--${name} is given twice`)
    if (spec.switches.includes(name)) {
      if (m[2] !== undefined) throw new OperatorError(`--${name} takes no value`)
      out.set(name, true)
    } else if (name in spec.values) {
      const value = m[2] ?? args[++i]
      if (value === undefined || (m[2] === undefined && value.startsWith('--'))) {
        throw new OperatorError(`--${name} needs a value`)
      }
      out.set(name, value)
    } else {
      throw new OperatorError(
        `unknown flag --${name} for "${kind}"; usage: ${kind} ${usageOf(kind)}`,
      )
    }
  }
  for (const [name, required] of Object.entries(spec.values)) {
    if (required && !out.has(name))
      throw new OperatorError(`--${name} is required; usage: ${kind} ${usageOf(kind)}`)
  }
  return out
}

function usageOf(kind: string): string {
  return USAGE.find((u) => u.startsWith(`${kind} `))?.slice(kind.length + 1) ?? ''
}

function integer(flag: string, text: string, min: number): number {
  if (!/^-?\d+$/.test(text.trim()))
    throw new OperatorError(`--${flag} must be a whole number, got "${text}"`)
  const n = Number(text.trim())
  if (!Number.isSafeInteger(n) || n < min) {
    throw new OperatorError(`--${flag} must be a whole number of at least ${min}, got "${text}"`)
  }
  return n
}

function name(text: string): string {
  const trimmed = text.trim()
  if (trimmed.length < 1 || trimmed.length > 128)
    throw new OperatorError('--name must be 1 to 128 characters')
  return trimmed
}

function accountId(text: string): string {
  if (!UUID.test(text))
    throw new OperatorError(`--account must be an account id (a UUID), got "${text}"`)
  return text.toLowerCase()
}

/** Validates the whole command line before anything is opened, so bad input never touches storage. */
export function parseCommand(argv: readonly string[]): OperatorCommand {
  const [noun, verb, ...rest] = argv
  const kind = `${noun ?? ''} ${verb ?? ''}`
  if (!(kind in SPECS)) {
    const given =
      argv.length === 0 ? 'no command given' : `unknown command "${argv.slice(0, 2).join(' ')}"`
    throw new OperatorError(`${given}; commands: ${USAGE.join(' | ')}`)
  }
  const k = kind as OperatorCommand['kind']
  const f = flags(k, rest)
  const get = (flag: string) => f.get(flag) as string
  switch (k) {
    case 'account create':
      return {
        kind: k,
        name: name(get('name')),
        credits: f.has('credits') ? integer('credits', get('credits'), 0) : 0,
      }
    case 'account credits':
      // A negative amount takes credits away (never below zero): how an operator corrects a mistake.
      return {
        kind: k,
        accountId: accountId(get('account')),
        add: integer('add', get('add'), Number.MIN_SAFE_INTEGER),
      }
    case 'apikey create':
      return { kind: k, accountId: accountId(get('account')) }
    case 'apikey revoke': {
      const key = get('key').trim()
      if (!API_KEY.test(key))
        throw new OperatorError('--key must be an API key shaped svc_live_<opaque>')
      return { kind: k, key }
    }
    case 'app create':
      return {
        kind: k,
        accountId: accountId(get('account')),
        name: name(get('name')),
        sandbox: f.has('sandbox'),
      }
  }
}

/** Runs one command; storage answers like "no such account" come back as OperatorError. */
export async function runCommand(
  ctx: Context,
  command: OperatorCommand,
): Promise<Record<string, unknown>> {
  try {
    switch (command.kind) {
      case 'account create':
        return await createAccount(ctx, command.name, command.credits)
      case 'account credits':
        return await addCredits(ctx, command.accountId, command.add)
      case 'apikey create':
        return { apiKey: await createApiKey(ctx, command.accountId) }
      case 'apikey revoke':
        if (!(await revokeApiKey(ctx, command.key)))
          throw new OperatorError('no live API key matches --key')
        return { ok: true }
      case 'app create': {
        const app = await createApplication(ctx, command.accountId, command.name, command.sandbox)
        return {
          appId: app.appId,
          appSecret: app.appSecret,
          publicKey: app.publicKey,
          keyId: app.keyId,
        }
      }
    }
  } catch (err) {
    if (err instanceof ApiError && err.status < 500) throw new OperatorError(err.message)
    throw err
  }
}
