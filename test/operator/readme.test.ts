import { afterAll, describe, expect, test } from 'bun:test'
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { delimiter, join } from 'node:path'
import { tmpdir } from 'node:os'
import { MODE } from '../support/helpers'

const ROOT = join(import.meta.dir, '..', '..')
const dataDir = mkdtempSync(join(tmpdir(), 'ls-readme-'))
afterAll(() => rmSync(dataDir, { recursive: true, force: true }))

/** The provisioning lines of the README's "Run it" section, as written. */
function provisioningCommands(): string[] {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8')
  const start = readme.indexOf('\n## Run it\n')
  const section = readme.slice(start, readme.indexOf('\n## ', start + 1))
  return [...section.matchAll(/```sh\n([\s\S]*?)```/g)]
    .flatMap((block) => (block[1] ?? '').split('\n'))
    .filter((line) => /\brun cli\b/.test(line))
}

/** A fresh machine after `npm install`: node and npm on the PATH, Bun only inside node_modules. */
const pathWithoutBun = (process.env.PATH ?? '')
  .split(delimiter)
  .filter((dir) => dir !== '' && !existsSync(join(dir, 'bun')))
  .join(delimiter)

async function shell(line: string, env: Record<string, string> = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  const proc = Bun.spawn(['sh', '-c', line], {
    cwd: ROOT,
    // Nothing of this run's settings: the README's commands work with none but the data folder.
    env: { PATH: pathWithoutBun, HOME: process.env.HOME ?? tmpdir(), DATA_DIR: dataDir, ...env },
    stdout: 'pipe',
    stderr: 'pipe',
  })
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  return { code, stdout, stderr }
}

/** npm's own notices (a newer npm exists, an option this machine's npmrc sets) are npm's lines, not the CLI's. */
const npmQuiet = { npm_config_update_notifier: 'false', npm_config_userconfig: '/dev/null' }

const lastJson = (stdout: string) => JSON.parse(stdout.trimEnd().split('\n').at(-1) ?? '')

// The README's commands run on the embedded default whatever the backend of this run: once is enough.
describe.skipIf(MODE !== 'embedded')('README "Run it" provisioning', () => {
  test('the commands as written work in a shell with no bun on the PATH', async () => {
    const commands = provisioningCommands()
    expect(commands).toHaveLength(2)
    expect((await shell('command -v bun')).code).not.toBe(0)

    const [createAccount = '', createApp = ''] = commands
    const account = await shell(createAccount)
    expect(account.code, account.stderr).toBe(0)
    const created = lastJson(account.stdout)
    expect(Object.keys(created).sort()).toEqual(['accountId', 'apiKey'])
    expect(created.apiKey).toStartWith('svc_live_')

    expect(createApp).toContain('<accountId>')
    const app = await shell(createApp.replaceAll('<accountId>', created.accountId))
    expect(app.code, app.stderr).toBe(0)
    expect(Object.keys(lastJson(app.stdout)).sort()).toEqual(['appId', 'appSecret', 'keyId', 'publicKey'])
  }, 120_000)
})

describe.skipIf(MODE !== 'embedded')('README CLI form: a failure', () => {
  // The form the README gives (`npx bun run cli`): Bun's own echo of the script line would be a second line.
  const cliForm = () => (provisioningCommands()[0] ?? '').replace(/\brun cli\b.*/, 'run cli')

  test.each([
    ['an unknown command', 'frob'],
    ['a key that matches nothing', `apikey revoke --key svc_live_${'A'.repeat(32)}`],
    ['a key given without its flag', `apikey revoke svc_live_${'A'.repeat(32)}`],
  ])('%s is one line on stderr, with no key in it', async (_, args) => {
    expect(cliForm()).toEndWith(' run cli')
    const run = await shell(`${cliForm()} ${args}`, npmQuiet)
    expect(run.code).toBe(2)
    expect(run.stdout).toBe('')
    expect(run.stderr.trimEnd().split('\n'), run.stderr).toEqual([expect.stringMatching(/^error: /)])
    expect(run.stderr).not.toContain('svc_live_')
  }, 60_000)
})
