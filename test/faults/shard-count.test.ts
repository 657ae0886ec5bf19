/**
 * The shard-count guard of an instance that started while Redis was unreachable: it could not read the
 * count the store's keys were written with then, so it reads it once Redis answers, and works only if
 * that count is its own (a nonce or a balance under two counts would live under two keys).
 */
import { expect, setSystemTime, test } from 'bun:test'
import Redis from 'ioredis'
import { openStore, type RedisStore } from '../../src/store/redis'
import { keys } from '../../src/store/store'
import { ownRedis, until } from '../support/servers'
import { loggedBy } from '../support/log-capture'
import { REPEAT_EVERY_MS } from '../../src/lib/log'
import { buildContext } from '../../src/boot'
import { ConfigError, loadConfig } from '../../src/config'
import { mkdtempSync, readdirSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

/** What a store operation answers: 'ok', or the message it failed with. */
const attempt = (store: RedisStore) =>
  store.take(`ls:test:shards:${crypto.randomUUID()}`, 10, 1, Date.now()).then(
    () => 'ok',
    (err: Error) => err.message,
  )

test('started without Redis: operations fail as in an outage until the shard count is read, then work, the count recorded', async () => {
  const redis = await ownRedis()
  await redis.stop()
  const store = (await openStore(redis.url)) as RedisStore
  try {
    expect(await attempt(store)).not.toBe('ok')
    expect(await store.ping()).toBe(false)
    await redis.start()
    expect(await until(() => attempt(store), (answer) => answer === 'ok')).toBe('ok')
    expect(await store.ping()).toBe(true)
    expect(await store.redis.get(keys.shardCount)).toBe('1')
  } finally {
    await store.close()
    await redis.stop()
  }
})

test('a Redis that holds the check unanswered: the start goes on after its wait, operations fail until the answer comes, then work', async () => {
  const redis = await ownRedis()
  const admin = new Redis(redis.url)
  await admin.call('CLIENT', 'PAUSE', '3000', 'ALL')
  const pausedAt = performance.now()
  const store = (await openStore(redis.url, null, 500)) as RedisStore
  try {
    expect(performance.now() - pausedAt).toBeLessThan(2500)
    expect(await attempt(store)).toBe('redis shard count not checked yet')
    expect(await until(() => attempt(store), (answer) => answer === 'ok')).toBe('ok')
    expect(performance.now() - pausedAt).toBeGreaterThan(2800)
  } finally {
    admin.disconnect()
    await store.close()
    await redis.stop()
  }
})

test('a check Redis refuses (no access to the count\'s key) keeps every operation failing while Redis answers, until it is allowed', async () => {
  const redis = await ownRedis()
  const admin = new Redis(redis.url)
  await admin.call('ACL', 'SETUSER', 'svc', 'on', '>pw', '~ls:test:*', '+@all')
  const store = (await openStore(`redis://svc:pw@127.0.0.1:${redis.port}`)) as RedisStore
  try {
    expect(await store.redis.ping()).toBe('PONG')
    expect(await attempt(store)).toBe('redis shard count not checked yet')
    expect(await store.ping()).toBe(false)
    await admin.call('ACL', 'SETUSER', 'svc', '~ls:shards')
    expect(await until(() => attempt(store), (answer) => answer === 'ok')).toBe('ok')
    expect(await admin.get(keys.shardCount)).toBe('1')
  } finally {
    admin.disconnect()
    await store.close()
    await redis.stop()
  }
})

test('started without Redis, which comes back written with another shard count: every operation keeps failing, /readyz with it', async () => {
  // Kept on disk across the restart, as the other instances' count would be.
  const redis = await ownRedis(['--save', '', '--appendonly', 'yes', '--appendfsync', 'always'])
  const admin = new Redis(redis.url)
  await admin.set(keys.shardCount, '64')
  admin.disconnect()
  await redis.stop()
  const store = (await openStore(redis.url)) as RedisStore
  try {
    await redis.start()
    expect(await until(() => attempt(store), (answer) => answer.includes("is not this instance's"))).toBe(
      "redis shard count is not this instance's",
    )
    // Redis answers, but none of this instance's keys may reach it.
    expect(await store.redis.ping()).toBe('PONG')
    expect(await store.ping()).toBe(false)
    expect(await attempt(store)).toBe("redis shard count is not this instance's")
    expect(await store.redis.get(keys.shardCount)).toBe('64')
    expect(await store.redis.keys('ls:test:*')).toEqual([])
  } finally {
    await store.close()
    await redis.stop()
  }
})

test('a database Redis refuses (past its `databases` setting) stops the start, writing nothing to database 0', async () => {
  const redis = await ownRedis()
  const db0 = new Redis(redis.url)
  try {
    // ioredis goes on in database 0 when its SELECT is refused, where other data lives. The refusal is
    // one setting line: the connection's own report of it is not logged beside it. (The clock is moved
    // past REPEAT_EVERY_MS: that line, logged by an earlier test, would be held back anyway.)
    setSystemTime(Date.now() + 2 * REPEAT_EVERY_MS)
    const logged = await loggedBy(() =>
      expect(openStore(`${redis.url}/99`)).rejects.toThrow('REDIS_URL names database 99, which this Redis refuses'),
    ).finally(() => setSystemTime())
    expect(logged.map((entry) => entry.msg)).not.toContain('redis connection error')
    expect(await db0.dbsize()).toBe(0)
    const store = (await openStore(`${redis.url}/5`)) as RedisStore
    try {
      expect(await attempt(store)).toBe('ok')
      expect(await db0.dbsize()).toBe(0)
    } finally {
      await store.close()
    }
  } finally {
    db0.disconnect()
    await redis.stop()
  }
})

test('a database Redis refuses stops an embedded start before it creates a database or generates a key', async () => {
  const redis = await ownRedis()
  const dataDir = mkdtempSync(join(tmpdir(), 'ls-refused-db-'))
  try {
    const start = buildContext(loadConfig({ DATA_DIR: dataDir, REDIS_URL: `${redis.url}/99` }))
    await expect(start).rejects.toBeInstanceOf(ConfigError)
    expect(readdirSync(dataDir)).toEqual([])
  } finally {
    await redis.stop()
  }
})

test('a Redis that restarted empty lost the recorded count: recorded again at the first read after, and if another count got there first, operations fail', async () => {
  const redis = await ownRedis()
  const store = (await openStore(redis.url)) as RedisStore
  const admin = () => new Redis(redis.url)
  const epoch = 'ls:ep:app:shard-count-test'
  const read = () => until(() => store.snapshot([epoch]).then(() => true, () => false), (done) => done)
  try {
    await read()
    await redis.stop()
    await redis.start()
    await read()
    const first = admin()
    expect(await until(() => first.get(keys.shardCount), (count) => count === '1')).toBe('1')
    first.disconnect()

    await redis.stop()
    await redis.start()
    const second = admin()
    await second.set(keys.shardCount, '64')
    await read()
    expect(await until(() => attempt(store), (answer) => answer !== 'ok')).toBe("redis shard count is not this instance's")
    second.disconnect()
  } finally {
    await store.close()
    await redis.stop()
  }
})

test('a Redis that lost its data lost the recorded count: recorded again at the next generation, and if another count got there first, operations fail', async () => {
  const redis = await ownRedis()
  const store = (await openStore(redis.url)) as RedisStore
  const admin = new Redis(redis.url)
  try {
    const epoch = 'ls:ep:app:shard-count-test'
    await store.snapshot([epoch])
    await admin.flushall()
    await store.snapshot([epoch])
    expect(await until(() => admin.get(keys.shardCount), (count) => count === '1')).toBe('1')
    expect(await attempt(store)).toBe('ok')

    // Lost again, and this time an instance spreading accounts over 64 shards records its count first.
    await admin.flushall()
    await admin.set(keys.shardCount, '64')
    await store.snapshot([epoch])
    expect(await until(() => attempt(store), (answer) => answer !== 'ok')).toBe("redis shard count is not this instance's")
    expect(await admin.get(keys.shardCount)).toBe('64')
  } finally {
    admin.disconnect()
    await store.close()
    await redis.stop()
  }
})

test('credentials Redis refuses stop the start, naming them, whatever the database', async () => {
  const redis = await ownRedis(['--save', '', '--appendonly', 'no', '--requirepass', 's3cret'])
  try {
    const url = (auth: string, db: string) => `redis://${auth}127.0.0.1:${redis.port}${db}`
    for (const [auth, db] of [[':wrong@', ''], [':wrong@', '/1'], ['', ''], ['', '/2']] as const) {
      await expect(openStore(url(auth, db))).rejects.toThrow("this Redis refuses REDIS_URL's credentials")
    }
    const store = await openStore(url(':s3cret@', '/1'))
    try {
      expect(await store.ping()).toBe(true)
    } finally {
      await store.close()
    }
  } finally {
    await redis.stop()
  }
})
