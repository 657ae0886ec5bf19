import { describe, expect, test } from 'bun:test'
import Redis from 'ioredis'
import { AuthorizeArgs, authorizeResult, B, BUCKET, E, EPOCH, F, HEAD, luaConstants, luaName, luaUnpack, REPLIES } from '../../src/store/redis/wire'
import { type AuthorizeInput, keys } from '../../src/store/store'
import { TEST_REDIS_URL } from '../support/helpers'
import { request } from './request'

type Value = string | number | null

/** One request as the wire should carry it, by field name: key fields as the key itself, null when absent. */
interface Expected {
  head: Record<keyof typeof F, Value>
  epochs: Record<keyof typeof E, Value>[]
  buckets: Record<keyof typeof B, Value>[]
}

const expected = (a: AuthorizeInput): Expected => ({
  head: {
    now: a.nowMs,
    epochCount: a.epochs.length,
    bucketCount: a.buckets.length,
    deny: a.deny ? 1 : 0,
    ceilingKey: a.ceiling?.key ?? null,
    ceilingLimit: a.ceiling?.limit ?? 0,
    ceilingTtl: a.ceiling?.ttlSeconds ?? 0,
    nonceKey: a.nonce?.key ?? null,
    nonceTtl: a.nonce?.ttlSeconds ?? 0,
    account: a.charge?.accountId ?? null,
    balanceKey: a.charge ? keys.balance(a.shard, a.charge.accountId) : null,
    pendingKey: a.charge ? keys.pendingCharges(a.shard, a.charge.accountId) : null,
    dirtyKey: a.charge ? keys.dirtyAccounts(a.shard) : null,
    cost: a.charge?.cost ?? 0,
    counterKey: a.charge?.counter?.key ?? null,
    counterEvery: a.charge?.counter?.every ?? 0,
  },
  epochs: a.epochs.map((e) => ({ key: e.key, expected: e.expected })),
  buckets: a.buckets.map((b) => ({ key: b.key, capacity: b.capacity, refillPerSecond: b.refillPerSecond })),
})

const S = '{s7}'
const full: AuthorizeInput = {
  nowMs: 1_924_992_000_123.5,
  shard: S,
  generation: 1,
  epochs: [
    { key: keys.appEpoch(S, 'app-1'), expected: 4 },
    { key: keys.licenseEpoch(S, 'KEY-1'), expected: 0 },
  ],
  ceiling: { key: keys.daily(S, 'app-1', '2031-01-01'), limit: 500, ttlSeconds: 90_000 },
  buckets: [{ key: keys.bucket(S, 'ip', '203.0.113.9'), capacity: 30, refillPerSecond: 0.5 }],
  nonce: { key: keys.nonce(S, 'app-1', 'n-1'), ttlSeconds: 300 },
  deny: true,
  charge: { accountId: 'acct-1', cost: 2, counter: { key: keys.heartbeats(S, 'KEY-1'), every: 10 } },
}
const bare = request(1, 1_924_992_000_200, { shard: S })
// Shares the account and the app epoch with `full`: their keys travel once.
const sharing: AuthorizeInput = {
  ...bare,
  epochs: [{ key: keys.appEpoch(S, 'app-1'), expected: 4 }],
  buckets: [
    { key: keys.bucket(S, 'ip', '198.51.100.7'), capacity: 10, refillPerSecond: 2 },
    { key: keys.bucket(S, 'app', 'app-1'), capacity: 1000, refillPerSecond: 100 },
  ],
  charge: { accountId: 'acct-1', cost: 1, counter: null },
}
const inputs = [full, bare, sharing]

const packOf = (batch: AuthorizeInput[], readEveryKey = false) => {
  const args = new AuthorizeArgs(S, readEveryKey)
  for (const a of batch) args.add(a)
  return args.packed()
}

/** Reads the packed argument back the way the script's wire description says, into field names. */
function decode(packed: Buffer): { names: string[]; reads: string[]; requests: Expected[] } {
  const names: string[] = []
  let at = 8
  for (let i = packed.readUInt32LE(0); i > 0; i--) {
    const length = packed.readUInt16LE(at)
    names.push(packed.toString('utf8', at + 2, at + 2 + length))
    at += 2 + length
  }
  const value = (type: string, n: number): Value => (type === 'key' ? (n === 0 ? null : (names[n - 1] as string)) : n)
  const requests: Expected[] = []
  while (at < packed.length) {
    const count = packed.readDoubleLE(at)
    const h = Array.from({ length: count }, (_, i) => packed.readDoubleLE(at + 8 * (i + 1)))
    at += 8 * (count + 1)
    // h[i] of the script is h[i - 1] here.
    const field = (position: number) => h[position - 1] as number
    const head = Object.fromEntries(HEAD.map((f) => [f.name, value(f.type, field(F[f.name]))])) as Expected['head']
    let group = HEAD.length + 1
    const epochs: Expected['epochs'] = []
    for (let i = 0; i < field(F.epochCount); i++, group += EPOCH.length) {
      epochs.push(Object.fromEntries(EPOCH.map((f) => [f.name, value(f.type, field(group + E[f.name]))])) as Expected['epochs'][0])
    }
    const buckets: Expected['buckets'] = []
    for (let i = 0; i < field(F.bucketCount); i++, group += BUCKET.length) {
      buckets.push(Object.fromEntries(BUCKET.map((f) => [f.name, value(f.type, field(group + B[f.name]))])) as Expected['buckets'][0])
    }
    expect(group - 1).toBe(count)
    requests.push({ head, epochs, buckets })
  }
  return { names, reads: names.slice(0, packed.readUInt32LE(4)), requests }
}

describe('authorize wire: the field table', () => {
  test('head positions are 1..n in table order, group offsets 0..n-1', () => {
    expect(HEAD.map((f) => F[f.name])).toEqual(HEAD.map((_, i) => i + 1))
    expect(EPOCH.map((f) => E[f.name])).toEqual([0, 1])
    expect(BUCKET.map((f) => B[f.name])).toEqual([0, 1, 2])
  })

  test('the Lua constants are the table: each head field, each group field and each reply code', () => {
    expect(luaConstants).toContain(`local F_NOW = ${F.now}\n`)
    expect(luaConstants).toContain(`local F_NONCE_KEY = ${F.nonceKey}\n`)
    expect(luaConstants).toContain(`local F_COUNTER_EVERY = ${F.counterEvery}\n`)
    expect(luaConstants).toContain(`local HEAD_WIDTH = ${HEAD.length}\n`)
    expect(luaConstants).toContain(`local EPOCH_EXPECTED = ${E.expected}\n`)
    expect(luaConstants).toContain(`local BUCKET_REFILL_PER_SECOND = ${B.refillPerSecond}\n`)
    expect(luaConstants).toContain(`local BUCKET_WIDTH = ${BUCKET.length}\n`)
    expect(luaConstants).toContain(`local R_NO_CREDITS = ${REPLIES.findIndex((r) => r.kind === 'no_credits')}`)
    const lines = luaConstants.split('\n')
    expect(lines.length).toBe(HEAD.length + EPOCH.length + BUCKET.length + 3 + REPLIES.length)
    expect(new Set(lines.map((l) => l.split(' ')[1])).size).toBe(lines.length)
  })
})

describe('authorize wire: packing', () => {
  test('each field of each request lands where the table says', () => {
    expect(decode(packOf(inputs)).requests).toEqual(inputs.map(expected))
  })

  test('a key shared by requests of one call travels once', () => {
    const { names } = decode(packOf(inputs))
    expect(new Set(names).size).toBe(names.length)
    expect(names.filter((n) => n === keys.appEpoch(S, 'app-1'))).toHaveLength(1)
    expect(names.filter((n) => n === keys.balance(S, 'acct-1'))).toHaveLength(1)
  })

  test('the keys the script reads come first: on one Redis the balances, epochs and buckets; on a cluster every key', () => {
    const sorted = (list: string[]) => [...list].sort()
    const readKeys = new Set(
      inputs.flatMap((a) => [...(a.charge ? [keys.balance(S, a.charge.accountId)] : []), ...a.epochs.map((e) => e.key), ...a.buckets.map((b) => b.key)]),
    )
    const single = decode(packOf(inputs))
    expect(sorted(single.reads)).toEqual(sorted([...readKeys]))
    // Every field still names its key, those placed after the reads too.
    expect(single.requests).toEqual(inputs.map(expected))
    const cluster = decode(packOf(inputs, true))
    expect(sorted(cluster.reads)).toEqual(sorted(cluster.names.filter((n) => n !== 'acct-1')))
    expect(cluster.names.at(-1)).toBe('acct-1')
    expect(cluster.requests).toEqual(inputs.map(expected))
  })

  test('a name the script would read for one request and not for another is refused and leaves the call as it was', () => {
    const args = new AuthorizeArgs(S)
    args.add(full)
    const before = args.packed()
    const nonceAsBucket = { ...bare, buckets: [{ key: keys.nonce(S, 'app-1', 'n-1'), capacity: 1, refillPerSecond: 1 }] }
    expect(() => args.add(nonceAsBucket)).toThrow('both as a key the script reads and as one it does not')
    expect(decode(args.packed())).toEqual(decode(before))
    args.add(sharing)
    expect(decode(args.packed()).requests).toEqual([full, sharing].map(expected))
  })

  test('a request of another shard, or with a key of another, is refused and leaves the call as it was', () => {
    const args = new AuthorizeArgs(S)
    args.add(bare)
    const before = args.packed()
    expect(() => args.add({ ...bare, shard: '{s8}' })).toThrow('a request of shard {s8} in a call of shard {s7}')
    // The foreign key comes after fields already written: they are taken back.
    const foreign = { ...full, buckets: [{ key: keys.bucket('{s8}', 'ip', '203.0.113.9'), capacity: 1, refillPerSecond: 1 }] }
    expect(() => args.add(foreign)).toThrow('a key of another shard than {s7}')
    expect(() => args.add({ ...bare, nonce: { key: 'ls:nonce:untagged', ttlSeconds: 5 } })).toThrow('another shard')
    expect(decode(args.packed()).requests).toEqual(decode(before).requests)
  })

  test('a request that names one bucket twice is refused and leaves the call as it was', () => {
    const args = new AuthorizeArgs(S)
    args.add(full)
    const before = args.packed()
    const bucket = { key: keys.bucket(S, 'ip', '203.0.113.9'), capacity: 5, refillPerSecond: 1 }
    const other = { ...bucket, key: keys.bucket(S, 'lic', 'K') }
    expect(() => args.add({ ...bare, buckets: [bucket, other, { ...bucket, capacity: 9 }] })).toThrow('names one bucket twice')
    expect(decode(args.packed()).requests).toEqual(decode(before).requests)
    // Two requests of one call may share a bucket: each takes from it in turn.
    args.add({ ...bare, buckets: [bucket, other] })
    args.add({ ...bare, buckets: [other, bucket] })
    expect(decode(args.packed()).requests).toHaveLength(3)
  })

  test('keys outside ASCII keep their bytes', () => {
    const a = { ...bare, nonce: { key: keys.nonce(S, 'app-1', 'nonce-é-ü-漢'), ttlSeconds: 5 } }
    expect(decode(packOf([a])).requests[0]?.head.nonceKey).toBe(a.nonce.key)
  })

  test('each reply code reads back as its kind, with what follows it', () => {
    const code = (kind: string) => REPLIES.findIndex((r) => r.kind === kind)
    // A reply opens with the shard's generation (authorize-script.ts), which a charge is made under.
    const answers = [code('ok'), 3, code('stale'), 2, 7, 9, code('limited'), 250, code('replay'), code('no_credits')]
    const flat = ['gen-1', ...answers] as unknown as number[]
    const read: unknown[] = []
    for (let at = 1; at < flat.length; ) {
      const [result, next] = authorizeResult(flat, at, 4)
      read.push(result)
      at = next
    }
    expect(read).toEqual([
      // With the count of the connection's drops when the call went.
      { kind: 'ok', charged: 3, chargedUnder: '4/gen-1' },
      { kind: 'stale', epochs: [7, 9] },
      { kind: 'limited', retryAfterMs: 250 },
      { kind: 'replay' },
      { kind: 'no_credits' },
    ])
    expect(() => authorizeResult([REPLIES.length], 0, 0)).toThrow('unexpected authorize reply')
  })
})

describe.skipIf(!TEST_REDIS_URL)('authorize wire: through Redis', () => {
  // The authorize script's own constants and unpacking, answering each request's fields by their Lua
  // names: what the script reads as h[F_NONCE_KEY] must be what the packing wrote as the nonce.
  const show = (fields: readonly { name: string; type: string }[], prefix: string, base: string) =>
    fields.map((f) => `r[#r + 1] = show('${f.type}', h[${base} + ${prefix}${luaName(f.name)}])`).join('\n')
  const ECHO = `${luaConstants}
${luaUnpack}
local function show(type, n)
  if type == 'key' then return n > 0 and names[n] or '' end
  return string.format('%.17g', n)
end
local out = {}
for _, h in ipairs(reqs) do
  local r = {}
  ${show(HEAD, 'F_', '0')}
  local g = HEAD_WIDTH + 1
  for _ = 1, h[F_EPOCH_COUNT] do
    ${show(EPOCH, 'EPOCH_', 'g')}
    g = g + EPOCH_WIDTH
  end
  for _ = 1, h[F_BUCKET_COUNT] do
    ${show(BUCKET, 'BUCKET_', 'g')}
    g = g + BUCKET_WIDTH
  end
  out[#out + 1] = r
end
return out
`
  const text = (v: Value) => (v === null ? '' : String(v))

  test('the script reads every field the packing wrote, by the names the table gives it', async () => {
    const redis = new Redis(TEST_REDIS_URL as string)
    try {
      const replies = await redis.eval(ECHO, 0, packOf(inputs))
      const inOrder = (e: Expected) => [
        ...HEAD.map((f) => text(e.head[f.name])),
        ...e.epochs.flatMap((g) => EPOCH.map((f) => text(g[f.name]))),
        ...e.buckets.flatMap((g) => BUCKET.map((f) => text(g[f.name]))),
      ]
      expect(replies).toEqual(inputs.map((a) => inOrder(expected(a))))
    } finally {
      redis.disconnect()
    }
  })
})
