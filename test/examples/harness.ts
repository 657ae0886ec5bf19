/**
 * A server started as the README's "Run it" says (`bun src/main.ts`, a new DATA_DIR, no MASTER_KEY:
 * the development key is generated), provisioned through the operator CLI as the README does next. On
 * the PostgreSQL + Redis pass the same server runs on them instead, with a MASTER_KEY, as in production.
 */
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { MODE, TEST_DATABASE_URL, TEST_MASTER_KEY, TEST_REDIS_URL } from '../support/helpers'
import { newDataDir } from '../support/data-dir'
import { runToExit, startServer, type ServerProcess } from '../support/server-process'

export const REPO_ROOT = join(import.meta.dir, '..', '..')

export interface Provisioned {
  accountId: string
  apiKey: string
  appId: string
  appSecret: string
  publicKey: string
  keyId: string
}

export interface ExampleServer {
  server: ServerProcess
  /** The settings the server runs with; the CLI and extra env for a test's own processes start from them. */
  env: Record<string, string>
  /** `bun run cli …`: the last stdout line parsed, or a thrown error with the CLI's stderr. */
  cli(args: string[]): Promise<Record<string, any>>
  /** An account with credits and one app, made through the CLI. */
  provision(name: string): Promise<Provisioned>
  /** A Developer API call with the account's key; the parsed body, or a thrown error naming the status. */
  api(apiKey: string, method: string, path: string, body?: unknown): Promise<any>
}

/**
 * `firstStart`: the DATA_DIR is empty, so the server creates the embedded database as a new user's first
 * start does (seconds of CPU); otherwise it holds a migrated, empty one (test/support/data-dir.ts).
 */
export async function startExampleServer(extraEnv: Record<string, string> = {}, { firstStart = false } = {}): Promise<ExampleServer> {
  const env: Record<string, string> = {
    DATA_DIR: firstStart ? mkdtempSync(join(tmpdir(), 'ls-examples-')) : await newDataDir('ls-examples-', { embedded: MODE === 'embedded' }),
    ...(MODE === 'postgres'
      ? // One process is enough here, and the suite's other servers share the two cores.
        { DATABASE_URL: TEST_DATABASE_URL!, REDIS_URL: TEST_REDIS_URL!, SERVER_PROCESSES: '1', MASTER_KEY: TEST_MASTER_KEY.toString('hex') }
      : { DATABASE_URL: '', REDIS_URL: '', MASTER_KEY: '' }),
    ...extraEnv,
  }
  const server = await startServer(env)

  async function cli(args: string[]) {
    const run = await runToExit(['src/operator/cli.ts', ...args], env)
    if (run.code !== 0) throw new Error(`cli ${args.slice(0, 2).join(' ')} exited ${run.code}: ${run.stderr}`)
    return JSON.parse(run.stdout.trim().split('\n').at(-1)!)
  }

  async function provision(name: string): Promise<Provisioned> {
    const { accountId, apiKey } = await cli(['account', 'create', '--name', name, '--credits', '100'])
    const app = await cli(['app', 'create', '--account', accountId, '--name', `${name} Desktop`])
    return { accountId, apiKey, ...app }
  }

  async function api(apiKey: string, method: string, path: string, body?: unknown) {
    const res = await fetch(`${server.url}${path}`, {
      method,
      headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    })
    const parsed = await res.json()
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(parsed)}`)
    return parsed
  }

  return { server, env, cli, provision, api }
}
