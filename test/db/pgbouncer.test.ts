/**
 * The server behind a pooler in transaction mode (PgBouncer), as the README's production notes suggest:
 * each transaction may run on another server connection, and what a session leaves on one (a lock, a
 * setting) stays with it for whichever client gets it next. One server connection here, so the next
 * client always gets the connection the last one left.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { chmodSync, existsSync, mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import postgres from 'postgres'
import { MIGRATION_LOCK, openDb } from '../../src/db/client'
import { withTimeout } from '../../src/lib/with-timeout'
import { hwid, nonce } from '../support/client'
import { MODE, TEST_DATABASE_URL, TEST_MASTER_KEY, TEST_REDIS_URL } from '../support/helpers'
import { runToExit, startServer } from '../support/server-process'
import { canListen, freePort, until } from '../support/servers'

const PGBOUNCER = '/usr/sbin/pgbouncer'
const hasPgbouncer = existsSync(PGBOUNCER)
if (MODE === 'postgres' && !hasPgbouncer) console.warn('SKIPPED: pgbouncer is missing; apt-get install pgbouncer to run the tests behind a pooler in transaction mode')

// Not describe.skipIf: bun runs a skipped async describe's body all the same.
if (MODE === 'postgres' && hasPgbouncer) describe('behind PgBouncer in transaction mode', async () => {
  const target = new URL(TEST_DATABASE_URL!)
  const port = await freePort()
  const dir = mkdtempSync(join(tmpdir(), 'ls-pgbouncer-'))
  chmodSync(dir, 0o755)
  writeFileSync(join(dir, 'users.txt'), '"postgres" ""\n')
  writeFileSync(
    join(dir, 'pgbouncer.ini'),
    [
      '[databases]',
      `* = host=${target.hostname} port=${target.port || 5432}`,
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      'unix_socket_dir =',
      'auth_type = trust',
      `auth_file = ${join(dir, 'users.txt')}`,
      'pool_mode = transaction',
      'default_pool_size = 1',
      'max_client_conn = 100',
    ].join('\n'),
  )
  // PgBouncer will not run as root; as another user it needs only to read its files.
  const bouncer = Bun.spawn([PGBOUNCER, ...(process.getuid?.() === 0 ? ['-u', 'nobody'] : []), join(dir, 'pgbouncer.ini')], { stdout: 'ignore', stderr: 'ignore' })
  await until(async () => !(await canListen(port)), (taken) => taken)
  // postgres.js's named statements live on one server connection: behind this pooler they are off.
  const pooled = `postgres://${target.username}@127.0.0.1:${port}${target.pathname}?prepare=false`
  const direct = postgres(TEST_DATABASE_URL!, { max: 1, onnotice: () => {} })
  afterAll(async () => {
    await direct.end({ timeout: 1 })
    bouncer.kill()
    await bouncer.exited
  })

  test('a start leaves no migration lock held, and starts at once all finish', async () => {
    const first = await openDb({ databaseUrl: pooled, dataDir: null, poolSize: 1 })
    await first.close()
    const held = await direct`
      SELECT count(*)::int AS n FROM pg_locks
      WHERE locktype = 'advisory' AND objid = ${MIGRATION_LOCK} AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`
    expect(held[0]!.n).toBe(0)
    const starts = await Promise.all([1, 2, 3].map(() => withTimeout(openDb({ databaseUrl: pooled, dataDir: null, poolSize: 1 }), 15_000)))
    expect(starts.every((started) => started !== null)).toBe(true)
    await Promise.all(starts.map((started) => started?.close()))
  })

  test('a server behind it serves the Developer API and the client endpoints, over several processes', async () => {
    const env = { DATABASE_URL: pooled, REDIS_URL: TEST_REDIS_URL!, MASTER_KEY: TEST_MASTER_KEY.toString('hex') }
    const cli = async (args: string[]) => {
      const run = await runToExit(['src/operator/cli.ts', ...args], env)
      expect(run.stderr).toBe('')
      return JSON.parse(run.stdout.trim().split('\n').at(-1)!)
    }
    const { accountId, apiKey } = await cli(['account', 'create', '--name', 'Pooled', '--credits', '10'])
    const { appId, appSecret } = await cli(['app', 'create', '--account', accountId, '--name', 'Pooled'])
    const server = await startServer({ ...env, SERVER_PROCESSES: '2' })
    try {
      const api = (method: string, path: string, body: unknown) =>
        fetch(`${server.url}${path}`, { method, headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' }, body: JSON.stringify(body) })
      const created = await api('POST', '/v1/licenses', { appId, quantity: 1 })
      expect(created.status).toBe(201)
      const { licenses } = (await created.json()) as { licenses: { licenseKey: string }[] }
      const device = hwid()
      const validate = () =>
        fetch(`${server.url}/auth/validate`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ appId, appSecret, licenseKey: licenses[0]!.licenseKey, hwid: device, nonce: nonce() }),
        }).then(async (res) => [res.status, ((await res.json()) as { status: string }).status])
      // The first binds the seat (a write), the second finds it bound.
      expect(await validate()).toEqual([200, 'success'])
      expect(await validate()).toEqual([200, 'success'])
      expect((await api('PUT', `/v1/licenses/${licenses[0]!.licenseKey}`, { action: 'revoke' })).status).toBe(200)
      expect((await validate())[0]).toBe(410)
    } finally {
      await server.stop()
    }
  })

  test("questions asked aside leave their limits to their own transaction, not to the next client's", async () => {
    const database = await openDb({ databaseUrl: pooled, dataDir: null, poolSize: 1 })
    try {
      expect(await database.aside((ask) => ask('SHOW statement_timeout', []))).toEqual([{ statement_timeout: '5s' }])
      const next = postgres(pooled, { max: 1, onnotice: () => {} })
      try {
        expect([...(await next`SHOW statement_timeout`)]).toEqual([{ statement_timeout: '0' }])
      } finally {
        await next.end({ timeout: 1 })
      }
    } finally {
      await database.close()
    }
  })
})
