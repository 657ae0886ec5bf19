import { parseArgs } from 'node:util'

/**
 * The operator CLI's command line: which commands exist, their flags, their help text, and the parse
 * of an argv into a command name and its flags. Converting the flags' text into typed values is
 * commands.ts's part.
 */

/** Bad input: the CLI prints the message as its one stderr line and exits 2. */
export class OperatorError extends Error {}

/** The command cannot run here and now (another process holds the data, a step failed): one line, exit 1. */
export class Refused extends Error {}

/** A command line that names no command, an unknown flag, a missing value: the line adds where help is. */
export class UsageError extends OperatorError {
  constructor(problem: string, command?: CommandName) {
    super(`${problem}; see \`${PROGRAM}${command ? ` ${command}` : ''} --help\``)
  }
}

export const PROGRAM = 'bun run cli'

/** The most a command line may hold, as JSON: far more than any command takes. */
export const MAX_COMMAND_LINE_BYTES = 32 * 1024

// A key or secret pasted into the wrong place must not land in scrollback or a CI log: API keys and
// webhook secrets by their prefix, app secrets and bare keys (hex, base64url, or base64 as a master key
// may be written) as a long run of their alphabet. UUIDs are blanked first: they are ids, not secrets,
// and quoting them back is what makes an error readable. A long path is hidden too, at no cost.
const UUID_ANYWHERE = /[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}/gi
const SECRET_SHAPED = /svc_live_|whsec_|[A-Za-z0-9+/_-]{32,}/i

const looksSecret = (text: string) => SECRET_SHAPED.test(text.replace(UUID_ANYWHERE, ' '))

const SHOWN_CHARS = 64

/**
 * The user's text as an error message shows it: not at all when it looks like a secret, else as a JSON
 * string, so a control character (an escape sequence pasted or piped in) is shown, not run by the
 * terminal, and cut to its first characters: the line stays one line.
 */
export const quoted = (text: string): string => {
  if (looksSecret(text)) return 'a value shaped like a key or secret (not shown)'
  const chars = [...text]
  return JSON.stringify(chars.length > SHOWN_CHARS ? `${chars.slice(0, SHOWN_CHARS).join('')}…` : text)
}

interface ValueFlag {
  type: 'string'
  /** How the value is shown in usage lines: `<accountId>`. */
  value: string
  required?: true
  help: string
}
interface SwitchFlag {
  type: 'boolean'
  help: string
}

interface CommandSpec {
  summary: string
  flags: Record<string, ValueFlag | SwitchFlag>
  /** The JSON object printed on success. */
  prints: string
  /** Paragraphs of the command's own help. */
  notes?: string[]
}

const accountFlag = (help: string, required = true): ValueFlag => ({
  type: 'string',
  value: '<accountId>',
  ...(required ? { required: true } : {}),
  help,
})
const limitFlag = (what: string): ValueFlag => ({
  type: 'string',
  value: '<n>',
  help: `at most n ${what}, newest first (default 100, at most 10000)`,
})

export const COMMANDS = {
  'account create': {
    summary: 'Create an account and its first API key',
    flags: {
      name: { type: 'string', value: '<name>', required: true, help: "the account's name, 1 to 128 characters" },
      credits: { type: 'string', value: '<n>', help: 'credits to start with, a whole number of at least 0 (default 0)' },
    },
    prints: '{ "accountId", "apiKey" }: the API key is shown only here',
  },
  'account credits': {
    summary: "Add credits to an account (a negative number takes some away, never below zero)",
    flags: {
      account: accountFlag('the account'),
      add: { type: 'string', value: '<n>', required: true, help: 'a whole number, e.g. --add 500 or --add -20' },
    },
    prints: '{ "accountId", "credits" }: the balance after the change',
  },
  'account list': {
    summary: 'List accounts with their credits and how many apps and live API keys they have',
    flags: { limit: limitFlag('accounts') },
    prints: '{ "accounts": [{ "accountId", "name", "credits", "createdAt", "apps", "activeApiKeys" }], "more" }',
    notes: ['"more" is true when older accounts were left out: a larger --limit shows them.'],
  },
  'apikey create': {
    summary: 'Create another API key for an account',
    flags: { account: accountFlag('the account the key acts for') },
    prints: '{ "apiKey" }: shown only here',
  },
  'apikey revoke': {
    summary: 'Revoke an API key; it fails from the next request on',
    flags: { key: { type: 'string', value: '<apiKey>', required: true, help: 'the key itself, svc_live_…' } },
    prints: '{ "ok": true }',
  },
  'app create': {
    summary: 'Create an app with its app secret and first signing key',
    flags: {
      account: accountFlag('the account that owns the app'),
      name: { type: 'string', value: '<name>', required: true, help: "the app's name, 1 to 128 characters" },
      sandbox: { type: 'boolean', help: 'a sandbox app: free, under a daily request ceiling' },
    },
    prints: '{ "appId", "appSecret", "publicKey", "keyId" }: the app secret is shown only here',
  },
  'app list': {
    summary: 'List apps with their active signing key (never a secret)',
    flags: {
      account: accountFlag("only this account's apps", false),
      limit: limitFlag('apps'),
    },
    prints: '{ "apps": [{ "appId", "accountId", "name", "sandbox", "disabled", "createdAt", "keyId", "publicKey" }], "more" }',
    notes: ['"more" is true when older apps were left out: a larger --limit shows them.'],
  },
  'master-key rotate': {
    summary: 'Re-seal every signing key and webhook secret with a new master key',
    flags: {},
    prints: '{ "rotated": { "signingKeys", "webhookSecrets" }, "alreadyRotated", "developmentKeyFile" }',
    notes: [
      'The new key comes from the environment variable NEW_MASTER_KEY (64 hex characters or base64 of 32 bytes, ' +
        'as MASTER_KEY), never from the command line; the current one is MASTER_KEY, or the development key ' +
        'in DATA_DIR when MASTER_KEY is unset, which is then replaced by the new key ("developmentKeyFile" names it).',
      'Every value is opened with the current key before anything is written, and all are re-sealed in one ' +
        'transaction: if one does not open, nothing changes. Stop every server first; the command refuses while ' +
        'a server holds DATA_DIR or is connected to DATABASE_URL. Then start the servers with MASTER_KEY set to the ' +
        'new key. Session tokens end (clients log in again) and license-list cursors handed out before expire.',
    ],
  },
} as const satisfies Record<string, CommandSpec>

export type CommandName = keyof typeof COMMANDS

const spec = (command: CommandName): CommandSpec => COMMANDS[command]
const isCommand = (name: string): name is CommandName => Object.hasOwn(COMMANDS, name)

/** Every flag of every command: a name means the same kind of flag in each command that has it. */
const PARSE_OPTIONS = Object.fromEntries([
  ['help', { type: 'boolean', short: 'h' }],
  ...Object.values(COMMANDS).flatMap((c: CommandSpec) => Object.entries(c.flags).map(([name, f]) => [name, { type: f.type }])),
]) as Record<string, { type: 'string' | 'boolean'; short?: string }>

const usageLine = (command: CommandName) =>
  [
    command,
    ...Object.entries(spec(command).flags).map(([name, f]) => {
      const text = f.type === 'string' ? `--${name} ${f.value}` : `--${name}`
      return f.type === 'string' && f.required ? text : `[${text}]`
    }),
  ].join(' ')

/** Breaks text into lines of at most `width` characters, each starting with `indent`. */
function wrap(text: string, indent = '', width = 100): string[] {
  const lines: string[] = []
  let line = ''
  for (const word of text.split(' ')) {
    if (line && indent.length + line.length + 1 + word.length > width) {
      lines.push(indent + line)
      line = word
    } else line = line ? `${line} ${word}` : word
  }
  return [...lines, indent + line]
}

/** The help of every command, or of one: plain text for people. */
export function helpText(command?: CommandName): string {
  if (command) {
    const { summary, flags, prints, notes = [] } = spec(command)
    const flagLines = Object.entries(flags).map(([name, f]) => {
      const left = f.type === 'string' ? `--${name} ${f.value}` : `--${name}`
      return `  ${left.padEnd(24)} ${f.help}${f.type === 'string' && f.required ? ' (required)' : ''}`
    })
    return [
      `Usage: ${PROGRAM} ${usageLine(command)}`,
      '',
      `${summary}.`,
      ...(flagLines.length ? ['', 'Flags:', ...flagLines] : []),
      '',
      'Prints, on the last line of stdout:',
      ...wrap(prints, '  '),
      ...notes.flatMap((n) => ['', ...wrap(n)]),
      '',
    ].join('\n')
  }
  return [
    `Usage: ${PROGRAM} <command> [flags]`,
    '',
    ...wrap(
      "Provisions the license service with the server's own settings (DATABASE_URL, REDIS_URL, DATA_DIR, " +
        'MASTER_KEY), also while a server runs. Without Bun on the PATH: npx bun run cli <command> [flags].',
    ),
    '',
    'Commands:',
    ...Object.entries(COMMANDS).flatMap(([c, s]) => [`  ${usageLine(c as CommandName)}`, `      ${s.summary}`]),
    '',
    ...wrap(
      `${PROGRAM} <command> --help shows a command's flags and output. Each command prints one JSON object on ` +
        'the last line of stdout and exits 0. A problem is one line on stderr: exit 2 for bad input or settings, ' +
        '1 for anything else (storage unreachable, a refusal).',
    ),
    '',
  ].join('\n')
}

/** A parsed command line: help to print, or a command with the text of its flags. */
export type Invocation = { help: string } | { command: CommandName; flags: ReadonlyMap<string, string | true> }

/**
 * Reads an argv. parseArgs splits it into tokens; it runs non-strict because its strict mode refuses
 * a value that starts with a dash (`--add -20`, which takes credits away), so each token is checked
 * here against the command's own flags instead, with messages naming the flag.
 */
export function parseInvocation(argv: readonly string[]): Invocation {
  // Whichever way the command then runs: through a server's socket (whose body bound it stays within
  // as JSON) it was refused as too long, run directly it went through.
  if (Buffer.byteLength(JSON.stringify(argv)) > MAX_COMMAND_LINE_BYTES) {
    throw new UsageError(`the command line is longer than ${MAX_COMMAND_LINE_BYTES / 1024} KB`)
  }
  const { tokens } = parseArgs({ args: [...argv], options: PARSE_OPTIONS, strict: false, allowPositionals: true, tokens: true })
  const words = tokens.flatMap((t) => (t.kind === 'positional' ? [t.value] : []))
  const name = words.slice(0, 2).join(' ')
  // A key or secret starting with a dash reads as flags: `-7z9…h…` as a group of one-letter flags that
  // asked for help, `--svc_live_…` as a flag an error would quote. Refused as what it is, first.
  for (const token of tokens) {
    if (token.kind !== 'option') continue
    const raw = argv[token.index] ?? ''
    const flag = raw.startsWith('--') ? raw.split('=', 1)[0]! : raw
    if (looksSecret(flag)) throw new UsageError(`unexpected argument ${quoted(flag)}`, isCommand(name) ? name : undefined)
  }
  const wantsHelp = tokens.some((t) => t.kind === 'option' && t.name === 'help')
  if (words[0] === 'help') {
    const topic = words.slice(1, 3).join(' ')
    if (topic === '') return { help: helpText() }
    if (isCommand(topic)) return { help: helpText(topic) }
    throw new UsageError(`no command ${quoted(topic)}`)
  }
  if (!isCommand(name)) {
    if (words.length === 0) {
      if (wantsHelp) return { help: helpText() }
      throw new UsageError('no command given')
    }
    throw new UsageError(`unknown command ${quoted(name)}`)
  }
  // Help wins over whatever else is wrong on the line: it is what the user is asking for.
  if (wantsHelp) return { help: helpText(name) }
  const flags = new Map<string, string | true>()
  const { flags: known } = spec(name)
  let commandWords = 0
  for (const token of tokens) {
    if (token.kind === 'positional') {
      if (++commandWords > 2) throw new UsageError(`unexpected argument ${quoted(token.value)}`, name)
      continue
    }
    if (token.kind === 'option-terminator') continue
    // Own names only: `--constructor` is no flag of any command.
    const flag = Object.hasOwn(known, token.name) ? known[token.name] : undefined
    if (!flag) throw new UsageError(`unknown flag ${quoted(token.rawName)} for "${name}"`, name)
    if (flags.has(token.name)) throw new UsageError(`--${token.name} is given twice`, name)
    if (flag.type === 'boolean') {
      if (token.value !== undefined) throw new UsageError(`--${token.name} takes no value`, name)
      flags.set(token.name, true)
      continue
    }
    // `--name --credits 5` would otherwise name the account "--credits".
    if (token.value === undefined || (!token.inlineValue && token.value.startsWith('--'))) {
      throw new UsageError(`--${token.name} needs a value`, name)
    }
    flags.set(token.name, token.value)
  }
  for (const [flag, f] of Object.entries(known)) {
    if (f.type === 'string' && f.required && !flags.has(flag)) throw new UsageError(`--${flag} is required`, name)
  }
  return { command: name, flags }
}
