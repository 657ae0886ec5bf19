import { expect, test } from 'bun:test'
import { allShards, keys, shardOf, shardOfKey } from '../../src/store/store'

// A rolling upgrade runs old and new instances on one Redis, and a restart finds the live balances and
// pending charges the old version left: on a single Redis every name stays what earlier versions wrote.
test('one shard: the key names of every earlier version', () => {
  const shard = shardOf('acct-1', 1)
  expect(allShards(1)).toEqual([shard])
  expect([
    keys.appEpoch(shard, 'app-1'),
    keys.licenseEpoch(shard, 'K'),
    keys.accountEpoch(shard, 'acct-1'),
    keys.bucket(shard, 'v:ip:app-1', '10.0.0.1'),
    keys.apiBucket('hash'),
    keys.nonce(shard, 'app-1', 'n'),
    keys.daily(shard, 'app-1', '2026-11-24'),
    keys.heartbeats(shard, 'K'),
    keys.balance(shard, 'acct-1'),
    keys.pendingCharges(shard, 'acct-1'),
    keys.flushing(shard, 'acct-1'),
    keys.dirtyAccounts(shard),
    keys.generation(shard),
  ]).toEqual([
    'ls:ep:app:app-1',
    'ls:ep:lic:K',
    'ls:ep:acct:acct-1',
    'ls:rl:v:ip:app-1:10.0.0.1',
    'ls:rl:api:hash',
    'ls:nonce:app-1:n',
    'ls:day:app-1:2026-11-24',
    'ls:hb:K',
    'ls:cr:acct-1',
    'ls:crp:acct-1',
    'ls:crf:acct-1',
    'ls:crdirty',
    'ls:gen',
  ])
  expect(shardOfKey(keys.balance(shard, 'acct-1'))).toBe(shard)
})

test('many shards: the tag leads every key, ahead of anything a caller supplies', () => {
  const shard = shardOf('acct-1', 64)
  expect(shard).toMatch(/^\{s\d+\}$/)
  expect(allShards(64)).toContain(shard)
  const nonce = keys.nonce(shard, 'app-1', '{s3}')
  expect(nonce.startsWith(`ls:${shard}:`)).toBe(true)
  expect(shardOfKey(nonce)).toBe(shard)
})
