import { describe, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { parseCommand } from '../../src/operator/commands'
import { COMMANDS, type CommandName } from '../../src/operator/args'
import { generateApiKey, generateAppSecret, generateWebhookSecret } from '../../src/lib/crypto'

/** The message parseCommand throws for an argv: what the CLI prints as its one stderr line. */
function problem(argv: string[]): string {
  try {
    parseCommand(argv)
  } catch (err) {
    return (err as Error).message
  }
  throw new Error(`${JSON.stringify(argv)} parsed`)
}

const SOME_UUID = '2b1f7c1e-1111-4111-8111-111111111111'

describe('operator commands: what an error quotes back', () => {
  const apiKey = generateApiKey()
  const appSecret = generateAppSecret()
  const webhookSecret = generateWebhookSecret()

  // Each a secret pasted where it does not belong: the flag that wanted an id or a number, or a stray word.
  test.each([
    ['a key or secret as --account', (s: string) => ['apikey', 'create', '--account', s]],
    ['a key or secret as a stray argument', (s: string) => ['apikey', 'revoke', s]],
    ['a key or secret as the command', (s: string) => [s]],
    ['an API key after help', (s: string) => ['help', s]],
    ['a key or secret as --add', (s: string) => ['account', 'credits', '--account', SOME_UUID, '--add', s]],
    ['a key or secret as --limit', (s: string) => ['account', 'list', '--limit', s]],
  ])('%s is named, never shown', (_, argv) => {
    // A bare key starts with a dash one time in 64: read as one-letter flags, with an h among them as help.
    const dashed = `-h${appSecret.slice(2)}`
    // A master key as base64 has + and / in it, which split it into runs too short to look secret.
    const masterKeys = ['MFfJ/rBjZWAx+cxFkf5+FgXVsJTjrW6MHNUynfeT/8E=', 'a'.repeat(21) + '+/' + 'b'.repeat(20) + '=', 'ab'.repeat(32)]
    for (const secret of [apiKey, appSecret, webhookSecret, apiKey.slice('svc_live_'.length), dashed, ...masterKeys]) {
      const message = problem(argv(secret))
      expect(message).toContain('a value shaped like a key or secret (not shown)')
      expect(message).not.toContain(secret)
    }
  })

  test('a key pasted as a flag of its own is named, never shown', () => {
    for (const argv of [['apikey', 'revoke', `--${apiKey}`], [`--${apiKey}`], ['help', `--${appSecret}`]]) {
      const message = problem(argv)
      expect(message).toContain('a value shaped like a key or secret (not shown)')
      expect(message).not.toContain(apiKey.slice('svc_live_'.length))
      expect(message).not.toContain(appSecret)
    }
    // Its value after `=` is a value: `--key=svc_live_…` is how a key is given.
    expect(parseCommand(['apikey', 'revoke', `--key=${apiKey}`])).toEqual({ command: { kind: 'apikey revoke', key: apiKey } })
  })

  test('a name is counted in characters, an emoji one, as the API counts an app name', () => {
    const emoji = (n: number) => '\u{1F600}'.repeat(n)
    expect(parseCommand(['account', 'create', '--name', emoji(128)])).toEqual({ command: { kind: 'account create', name: emoji(128), credits: 0 } })
    expect(problem(['account', 'create', '--name', emoji(129)])).toContain('--name must be 1 to 128 characters')
  })

  test('a name PostgreSQL cannot store (NUL, an unpaired surrogate: only a request made by hand on the socket has one) is bad input', () => {
    for (const name of ['a\u0000b', 'lone\ud800', '\udc00x']) {
      expect(problem(['account', 'create', '--name', name])).toContain('--name must not contain NUL characters or unpaired surrogates')
      expect(problem(['app', 'create', '--account', '00000000-0000-4000-8000-000000000000', '--name', name])).toContain('--name must not contain NUL')
    }
  })

  test("a flag named like an object's inherited member is as unknown as any other", () => {
    for (const flag of ['--constructor=oops', '--__proto__=x', '--hasOwnProperty=x', '--toString']) {
      expect(problem(['account', 'list', '--limit', '1', flag])).toContain(`unknown flag "${flag.split('=')[0]}" for "account list"`)
    }
  })

  test('an ordinary mistake is still quoted back, a UUID-like id too', () => {
    expect(problem(['account', 'list', '--limit', 'ten'])).toContain('got "ten"')
    expect(problem(['frob', 'nicate'])).toContain('unknown command "frob nicate"')
    const almostUuid = `${SOME_UUID}0`
    expect(problem(['app', 'list', '--account', almostUuid])).toContain(`got "${almostUuid}"`)
    expect(problem(['app', 'create', '--account', SOME_UUID, SOME_UUID])).toContain(`unexpected argument "${SOME_UUID}"`)
  })

  test('a command line past 32 KB is bad input, however it would run (the server takes it in a body of 64 KB)', () => {
    const padded = `${' '.repeat(35_000)}Name${' '.repeat(35_000)}`
    expect(problem(['account', 'create', '--name', padded])).toContain('the command line is longer than 32 KB')
    expect(problem(['account', 'create', '--name', '\u0001'.repeat(6_000)])).toContain('the command line is longer than 32 KB')
  })

  test('quoted text cannot drive the terminal or run past one line: control characters escaped, long text cut', () => {
    const clear = '\u001b[2J\u001b[H'
    for (const args of [['frob', clear], ['account', 'list', '--limit', clear], ['account', 'list', `--x${clear}`]]) {
      const line = problem(args)
      expect(line).not.toMatch(/[\u0000-\u001f\u007f]/)
      expect(line).toContain('\\u001b[2J')
    }
    const long = problem(['account', 'list', '--limit', `${'9 '.repeat(200)}`])
    expect(long).toContain(`got "${'9 '.repeat(32)}…"`)
    expect(long.length).toBeLessThan(200)
  })
})

test("each command's help prints what the README's table says it prints", () => {
  const readme = readFileSync(join(import.meta.dir, '..', '..', 'README.md'), 'utf8')
  for (const [name, command] of Object.entries(COMMANDS) as [CommandName, (typeof COMMANDS)[CommandName]][]) {
    const row = readme.split('\n').find((line) => line.startsWith('| `') && line.includes(`bun run cli ${name}`))
    expect(row, name).toBeDefined()
    // The JSON's shape; the help may say more after it.
    const shape = command.prints.replace(/: [^"}\]]*$/, '')
    expect(row, name).toEndWith(`| \`${shape}\` |`)
  }
})
