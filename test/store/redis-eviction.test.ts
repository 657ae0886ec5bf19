/**
 * A Redis that evicts keys when full drops nonces (a validate can be replayed) and charges not yet in
 * PostgreSQL (unbilled); README asks for noeviction, and a start on any other policy says so in the log.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { openStore } from '../../src/store/redis'
import { setLogLevel } from '../../src/lib/log'
import { ownRedis } from '../support/servers'
import { loggedBy } from '../support/log-capture'

beforeAll(() => setLogLevel('warn'))
afterAll(() => setLogLevel('error'))

test.each([
  ['allkeys-lru', true],
  ['volatile-lru', true],
  ['noeviction', false],
])('a Redis whose maxmemory-policy is %s: warned of at start, %p', async (policy, warned) => {
  const redis = await ownRedis(['--save', '', '--appendonly', 'no', '--maxmemory-policy', policy])
  try {
    const logged = await loggedBy(async () => (await openStore(redis.url)).close())
    const warnings = logged.filter((entry) => entry.level === 'warn').map((entry) => entry.msg)
    expect(warnings).toEqual(
      warned
        ? [`redis evicts keys when it is full (maxmemory-policy ${policy}): evicted nonces let validates be replayed and evicted charges go unbilled; set maxmemory-policy noeviction`]
        : [],
    )
  } finally {
    await redis.stop()
  }
})
