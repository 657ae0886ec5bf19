import { expect, test } from 'bun:test'
import { buildContext } from '../../src/boot'
import { loadConfig } from '../../src/config'
import { createAccount } from '../../src/accounts/service'
import { createApplication } from '../../src/apps/service'
import { type EventName, recordEvents } from '../../src/delivery/outbox'
import { createWebhook } from '../../src/webhooks/service'
import { newDataDir } from '../support/data-dir'
import { TEST_DATABASE_URL, TEST_MASTER_KEY, TEST_REDIS_URL } from '../support/helpers'
import { startServer } from '../support/server-process'
import { signatureValid, startReceiver, testCertificate, until } from '../support/webhooks-receiver'

// Spawns the server twice and opens the database three times: a budget of its own.
test('events committed while the server was dead are delivered once after a kill -9 and restart', async () => {
  const { certFile } = testCertificate()
  const env: Record<string, string> = {
    ...(process.env as Record<string, string>),
    HOST: '127.0.0.1',
    PORT: '0',
    DATA_DIR: await newDataDir('ls-whrestart-', { embedded: !TEST_DATABASE_URL }),
    DATABASE_URL: TEST_DATABASE_URL ?? '',
    REDIS_URL: TEST_REDIS_URL ?? '',
    // The PostgreSQL pass shares its database, whose secrets are sealed with the tests' key.
    MASTER_KEY: TEST_MASTER_KEY.toString('hex'),
    WEBHOOK_ALLOW_PRIVATE_TARGETS: 'true',
    NODE_EXTRA_CA_CERTS: certFile,
    LOG_LEVEL: 'info',
  }
  await using rx = startReceiver()
  const config = loadConfig(env)

  // Provision with the server's own settings (the embedded database admits one process at a time).
  let ctx = await buildContext(config)
  const account = await createAccount(ctx, 'Restart test', 100)
  const app = await createApplication(ctx, account.accountId, 'Restart app', false)
  const hook = await createWebhook(ctx, account.accountId, app.appId, {
    url: rx.url('/restart'),
    events: ['license.created', 'license.revoked'],
  })
  const commit = async (tag: string, n: number) => {
    const list = Array.from({ length: n }, (_, i) => ({
      event: (i % 2 ? 'license.revoked' : 'license.created') as EventName,
      data: { licenseKey: `${tag}-${i}`, appId: app.appId },
      occurredAt: new Date(),
    }))
    await ctx.database.db.transaction((tx) => recordEvents(tx, list))
    return list.map((e) => e.data.licenseKey)
  }
  const expected = await commit('before-first-start', 4)
  await ctx.webhookPool.close()
  await ctx.store.close()
  await ctx.database.close()

  const createLicense = async (base: string) => {
    const res = await fetch(`${base}/v1/licenses`, {
      method: 'POST',
      headers: { authorization: `Bearer ${account.apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ appId: app.appId }),
    })
    expect(res.status).toBe(201)
    const { licenses } = (await res.json()) as { licenses: { licenseKey: string }[] }
    return licenses[0]!.licenseKey
  }
  const keysAt = () => rx.at('/restart').map((r) => r.body.data.licenseKey as string)
  const first = await startServer(env)
  try {
    await until(() => keysAt().length >= expected.length, 'the backlog from before the first start')
    // A change made through the running server's API is delivered by it as well.
    expected.push(await createLicense(first.url))
    await until(() => keysAt().length >= expected.length, 'the license.created of the API call')
  } finally {
    await first.stop('SIGKILL')
  }

  // Committed while no server runs: exactly the "died between commit and delivery" case.
  ctx = await buildContext(config)
  expected.push(...(await commit('while-dead', 6)))
  await ctx.webhookPool.close()
  await ctx.store.close()
  await ctx.database.close()

  const second = await startServer(env)
  try {
    await until(() => keysAt().length >= expected.length, 'the events committed while the server was dead')
    // Deliveries go out in commit order: once a later change's arrives, anything repeated would have too.
    expected.push(await createLicense(second.url))
    await until(() => keysAt().includes(expected.at(-1)!), 'the sentinel after the restart')
    expect(keysAt().sort()).toEqual([...expected].sort())
    for (const r of rx.at('/restart')) expect(signatureValid(r, hook.secret)).toBe(true)
  } finally {
    expect(await second.stop()).toBe(0)
  }
}, 90_000)
