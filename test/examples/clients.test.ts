/**
 * The README's client examples (examples/node, examples/python, examples/go) run as a vendor would run
 * them, against a server started as the README says and provisioned through the CLI and the Developer
 * API. Each must accept a good license and its offline file, and refuse (non-zero exit) a revoked
 * license, a signature by another key, a file for another machine and a tampered file.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { REPO_ROOT, startExampleServer } from './harness'

const work = mkdtempSync(join(tmpdir(), 'ls-clients-'))

interface Client {
  name: string
  /** The command line, or why this machine cannot run it (its tests are then skipped, saying what to install). */
  command: string[] | { missing: string }
}

function onPath(command: string[]): boolean {
  return spawnSync(command[0]!, command.slice(1), { stdio: 'ignore' }).status === 0
}

// Built once here, outside any test's time limit: a first build on a fresh machine compiles the stdlib.
function goCommand(): Client['command'] {
  if (!onPath(['go', 'version'])) return { missing: 'Go 1.19 or later on PATH (apt-get install golang-go)' }
  const binary = join(work, 'license-check')
  const build = spawnSync('go', ['build', '-o', binary, '.'], { cwd: join(REPO_ROOT, 'examples', 'go'), encoding: 'utf8' })
  if (build.status !== 0) throw new Error(`go build of examples/go failed: ${build.stderr}`)
  return [binary]
}

// A python3 of pyenv's may come first on PATH without the package that Debian's python3-cryptography
// gives the system's /usr/bin/python3.
const python = ['python3', '/usr/bin/python3'].find((bin) => onPath([bin, '-c', 'import cryptography']))

const clients: Client[] = [
  { name: 'node', command: ['node', join(REPO_ROOT, 'examples', 'node', 'license-check.mjs')] },
  {
    name: 'python',
    command: python
      ? [python, join(REPO_ROOT, 'examples', 'python', 'license_check.py')]
      : { missing: 'python3 with the cryptography package (apt-get install python3-cryptography, or pip install cryptography)' },
  },
  { name: 'go', command: goCommand() },
]

// The README's first start: the client examples run against a server that made its database itself.
const running = await startExampleServer({}, { firstStart: true })
afterAll(() => running.server.stop())
const vendor = await running.provision('Example Vendor')
const stranger = await running.provision('Another Vendor')
const HWID = 'example-machine-7f3a9c2e'

await running.api(vendor.apiKey, 'PUT', `/v1/apps/${vendor.appId}/variables`, { tier: 'pro' })
const newLicense = async () => {
  const { licenses } = await running.api(vendor.apiKey, 'POST', '/v1/licenses', { appId: vendor.appId, maxHwidSlots: 2 })
  return licenses[0].licenseKey as string
}
const goodKey = await newLicense()
const revokedKey = await newLicense()
await running.api(vendor.apiKey, 'PUT', `/v1/licenses/${revokedKey}`, { action: 'revoke' })

// The offline file binds HWID to a seat of the good license; the online checks then find it bound.
const minted = await running.api(vendor.apiKey, 'POST', `/v1/licenses/${goodKey}/offline-files`, { hwids: [HWID] })
const offlineFile = join(work, `${goodKey}.authforge`)
writeFileSync(offlineFile, minted.file)
const tamperedFile = join(work, 'tampered.authforge')
{
  // One character of the payload changed, the signature kept: what a customer editing the file does.
  const lines = minted.file.split('\n')
  const at = lines.findIndex((line: string) => line === '') + 1
  lines[at] = (lines[at][0] === 'A' ? 'B' : 'A') + lines[at].slice(1)
  writeFileSync(tamperedFile, lines.join('\n'))
}

// A genuine, signed validate answer, recorded to be replayed later by a man in the middle.
const recordedReply = await (
  await fetch(`${running.server.url}/auth/validate`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ appId: vendor.appId, appSecret: vendor.appSecret, licenseKey: goodKey, hwid: HWID, nonce: 'recorded-nonce-0001' }),
  })
).json()
const replayer = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: () => Response.json(recordedReply) })
afterAll(() => replayer.stop(true))

const settings = (overrides: Record<string, string> = {}): Record<string, string> => ({
  LS_BASE_URL: running.server.url,
  LS_APP_ID: vendor.appId,
  LS_APP_SECRET: vendor.appSecret,
  LS_PUBLIC_KEY: vendor.publicKey,
  LS_LICENSE_KEY: goodKey,
  LS_HWID: HWID,
  LS_OFFLINE_FILE: offlineFile,
  ...overrides,
})

// Asynchronous: the replaying server below lives in this process and must answer while a client runs.
async function run(client: Client & { command: string[] }, env: Record<string, string>, args: string[] = []) {
  // Only what the example reads: no LS_* of the caller's leaks in, and PATH/HOME for the interpreters.
  const base = { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? tmpdir() }
  const proc = Bun.spawn([...client.command, ...args], { env: { ...base, ...env }, stdout: 'pipe', stderr: 'pipe' })
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
  return { code, stdout, stderr }
}

// Go and Python are system packages npm install cannot bring: where one is missing its example's tests are
// skipped with a warning, so a fresh machine's `npm test` still passes. This machine and CI have both.
const runnable = clients.filter((client): client is Client & { command: string[] } => {
  if (Array.isArray(client.command)) return true
  console.warn(`SKIPPED: the ${client.name} example needs ${client.command.missing}`)
  return false
})

describe.each(runnable)('the $name example', (client) => {
  test('accepts the license online (validate, signature, nonce, heartbeat) and its offline file', async () => {
    const r = await run(client, settings())
    expect(r.code, r.stderr).toBe(0)
    const lines = r.stdout.trim().split('\n')
    expect(lines[0]).toMatch(
      new RegExp(`^validate: ok, license ${goodKey} \\(expires never\\), seat 1 of 2, session until \\S+Z, signed by key_`),
    )
    expect(lines[1]).toBe('variables: app {"tier":"pro"}, license {}')
    expect(lines[2]).toMatch(/^heartbeat: ok, session until \S+Z$/)
    expect(lines[3]).toBe(`offline file: ok, license ${goodKey}, file expires never, valid on this machine (1 of 1 bound)`)
    expect(lines[4]).toBe('license: good')
  })

  test('checks the offline file alone, with no server and no secret', async () => {
    const r = await run(client, settings({ LS_BASE_URL: '', LS_APP_SECRET: '', LS_LICENSE_KEY: '' }))
    expect(r.code, r.stderr).toBe(0)
    expect(r.stdout).toContain(`offline file: ok, license ${goodKey}`)
  })

  test('flags override the environment', async () => {
    const r = await run(client, settings({ LS_LICENSE_KEY: revokedKey }), ['--license-key', goodKey])
    expect(r.code, r.stderr).toBe(0)
  })

  test.each([
    ['a revoked license', { LS_LICENSE_KEY: revokedKey }, '/auth/validate refused: revoked (HTTP 410)'],
    ['a wrong app secret', { LS_APP_SECRET: 'not-the-secret' }, '/auth/validate refused: invalid_app (HTTP 401)'],
    [
      "another app's public key",
      { LS_PUBLIC_KEY: stranger.publicKey },
      "/auth/validate: the signature does not verify with the app's public key",
    ],
    [
      'a replayed answer (signed, but for an earlier nonce)',
      { LS_BASE_URL: `http://127.0.0.1:${replayer.port}`, LS_OFFLINE_FILE: '' },
      '/auth/validate: the nonce is not ours',
    ],
    ['a file for another machine', { LS_LICENSE_KEY: '', LS_HWID: 'some-other-machine' }, 'offline file refused: hwid_mismatch'],
    ['a tampered file', { LS_LICENSE_KEY: '', LS_OFFLINE_FILE: tamperedFile }, 'offline file refused: bad_signature'],
    ["another app's file", { LS_LICENSE_KEY: '', LS_APP_ID: stranger.appId }, 'offline file refused: wrong_app'],
  ])('refuses %s with exit 1 and says why', async (_, overrides, message) => {
    const r = await run(client, settings(overrides))
    expect(r.code, r.stdout).toBe(1)
    expect(r.stderr).toContain(`license check failed: ${message}`)
    expect(r.stdout).not.toContain('license: good')
  })

  test('a missing setting is exit 2 naming it', async () => {
    const r = await run(client, settings({ LS_HWID: '' }))
    expect(r.code).toBe(2)
    expect(r.stderr).toContain('missing --hwid (LS_HWID)')
  })
})

test('the offline file the examples read is the one the API minted, unchanged', () => {
  expect(readFileSync(offlineFile, 'utf8')).toBe(minted.file)
})
