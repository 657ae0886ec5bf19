/**
 * A Redis Cluster node answers CLUSTER SLOTS (which master serves which slot) with a reply of another
 * shape: a compromised or impostor node, or anyone on the path of a connection without TLS. The
 * instance that asked finds no cluster, as when its seed nodes are down (a validate gets system_error),
 * the process goes on, and once the node answers soundly the store serves as before. ioredis 5.9.2
 * unpatched (patches/ioredis+5.9.2.patch) read the reply without looking: a null where a range or a
 * node should be threw out of its callback, an uncaught error that ends the server process, and a range
 * past the last slot filled the slot table for ever, blocking the process.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { RedisStore } from '../../src/store/redis'
import { hwid, insertLicense, nonce } from '../support/client'
import { makeTestApp, MODE } from '../support/helpers'
import { ownRedisCluster } from '../support/redis-cluster'
import { until } from '../support/servers'
import { TamperingProxy } from '../support/tampering-proxy'
import { collectUncaught } from '../support/uncaught'

const SHARDS = 64

/** The commands of one write of a client: arrays of bulk strings, each read as its words. */
function commandsOf(data: Buffer): string[] {
  const lines = data.toString('latin1').split('\r\n')
  const commands: string[] = []
  for (let i = 0; i < lines.length; i++) {
    const count = /^\*(\d+)$/.exec(lines[i] ?? '')
    if (!count) continue
    const words = Array.from({ length: Number(count[1]) }, (_, k) => lines[i + 2 + 2 * k] ?? '')
    commands.push(words.join(' ').toLowerCase())
    i += 2 * Number(count[1])
  }
  return commands
}

/** A node that takes every command (the client's name and library) and answers CLUSTER SLOTS with `slots`. */
const answering = (slots: string) => (data: Buffer) =>
  Buffer.from(commandsOf(data).map((command) => (command === 'cluster slots' ? slots : '+OK\r\n')).join(''))

const HOSTILE = {
  'a null where a node should be': '*1\r\n*3\r\n:0\r\n:16383\r\n$-1\r\n',
  'a null where a range should be': '*1\r\n$-1\r\n',
  'a range past the last slot': '*1\r\n*3\r\n:0\r\n:99999999999\r\n*2\r\n$9\r\n127.0.0.1\r\n:7000\r\n',
}

// A cluster of the test's own and instances on the shared PostgreSQL: the PostgreSQL pass only.
if (MODE === 'postgres') {
  describe('a cluster node answers CLUSTER SLOTS with what the client cannot take', async () => {
    // Unpatched, the range's case blocks this process for ever: fail before it instead.
    const client = readFileSync(join(import.meta.dir, '..', '..', 'node_modules', 'ioredis', 'built', 'cluster', 'index.js'), 'utf8')
    if (!client.includes('function isSlotsReply(')) throw new Error('ioredis is not patched (npm install applies patches/): this test would hang')

    const cluster = await ownRedisCluster()
    const proxy = new TamperingProxy(cluster.ports[0]!)
    const seed = `redis://127.0.0.1:${await proxy.listen()}`
    const uncaught = collectUncaught()
    const sound = new RedisStore(cluster.url, { cluster: { shards: SHARDS } })
    afterAll(async () => {
      await sound.close()
      proxy.close()
      await cluster.stop()
    })

    // The app and its license, seen through an instance whose seed node answers soundly.
    const provider = await makeTestApp({ store: sound })
    const account = await provider.seed({ credits: 1000 })
    const licenseKey = await insertLicense(provider.ctx, account.appId)
    const h = hwid()

    for (const [name, slots] of Object.entries(HOSTILE)) {
      test(`${name}: no cluster is found, the process goes on, the store comes back`, async () => {
        // A new instance asks its seed node (this proxy) for the slots when it connects.
        proxy.impostor = answering(slots)
        const store = new RedisStore(seed, { cluster: { shards: SHARDS } })
        try {
          const t = await makeTestApp({ store })
          const validate = () =>
            t.req('POST', '/auth/validate', { body: { appId: account.appId, appSecret: account.appSecret, licenseKey, hwid: h, nonce: nonce() } })
          try {
            const refused = await validate()
            expect(refused.body).toEqual({ status: 'failed', error: 'system_error' })
            expect(refused.status).toBe(500)
          } finally {
            proxy.impostor = null
          }
          expect(uncaught).toEqual([])
          const back = await until(validate, (res) => res.status === 200)
          expect(back.status, JSON.stringify(back.body)).toBe(200)
        } finally {
          await store.close()
        }
      })
    }
  })
}
