import { type AuthorizeInput, type AuthorizeResult, CLOCK_STEP_MS, EPOCH_TTL_MS, keys, type Shard, shardPrefix } from '../store'

/**
 * The authorize script's wire format, defined once: the TypeScript packing below writes each number
 * where these tables put it, and the script reads it through Lua constants made from the same tables
 * (`luaConstants`), so a change here changes both sides.
 *
 * The call's one argument (ARGV[1]) is the key count (uint32), the read count (uint32), each distinct
 * key once as its UTF-8 length (uint16) and bytes, the first `read count` of them the keys the script
 * reads (AuthorizeArgs), then every number of the batch as a double, all little-endian. A request's
 * numbers are their count, then the head (`HEAD`, read by the script as h[F_NOW] and so on), then
 * `epochCount` epoch groups and `bucketCount` bucket groups. A field of type 'key' is the 1-based
 * position of a string in the key section (a Redis key, or the account id), 0 when absent; every field
 * of an absent part (no ceiling, no nonce, no charge, no counter) is 0.
 */
interface Field {
  readonly name: string
  readonly type: 'key' | 'count' | 'flag' | 'number'
  readonly meaning: string
}

export const HEAD = [
  { name: 'now', type: 'number', meaning: 'the request time, ms since the epoch' },
  { name: 'epochCount', type: 'count', meaning: 'epoch groups after the head' },
  { name: 'bucketCount', type: 'count', meaning: 'bucket groups after the epoch groups' },
  { name: 'deny', type: 'flag', meaning: '1: the request already failed in-process, stop before the charge' },
  { name: 'ceilingKey', type: 'key', meaning: 'the sandbox daily ceiling counter' },
  { name: 'ceilingLimit', type: 'number', meaning: 'requests the ceiling allows' },
  { name: 'ceilingTtl', type: 'number', meaning: 'seconds the ceiling counter lives from its first request' },
  { name: 'nonceKey', type: 'key', meaning: 'the nonce, claimed once' },
  { name: 'nonceTtl', type: 'number', meaning: 'seconds the nonce stays claimed' },
  { name: 'account', type: 'key', meaning: 'the charged account id, as the dirty set holds it' },
  { name: 'balanceKey', type: 'key', meaning: "the account's live balance" },
  { name: 'pendingKey', type: 'key', meaning: "the account's charges not yet in PostgreSQL" },
  { name: 'dirtyKey', type: 'key', meaning: 'the set of accounts with pending charges, or refused for want of credits' },
  { name: 'cost', type: 'number', meaning: 'credits charged' },
  { name: 'counterKey', type: 'key', meaning: 'heartbeats: the counter that charges only every counterEvery-th call' },
  { name: 'counterEvery', type: 'number', meaning: 'heartbeats: charge once in this many calls' },
] as const satisfies readonly Field[]

/** One epoch group: the cache entry is fresh only while the key still holds `expected`. */
export const EPOCH = [
  { name: 'key', type: 'key', meaning: 'the epoch key' },
  { name: 'expected', type: 'number', meaning: 'the value the caller read' },
] as const satisfies readonly Field[]

/** One bucket group: a token bucket taken from, all of a request's or none. */
export const BUCKET = [
  { name: 'key', type: 'key', meaning: "the bucket's theoretical arrival time" },
  { name: 'capacity', type: 'number', meaning: 'tokens the bucket holds' },
  { name: 'refillPerSecond', type: 'number', meaning: 'tokens added a second' },
] as const satisfies readonly Field[]

/**
 * The script's answer for one request, by code (its position here), appended to one flat integer array:
 * the code, then what `then` says.
 */
export const REPLIES = [
  { kind: 'ok', then: 'the amount charged' },
  { kind: 'stale', then: 'the epoch count and each current epoch' },
  { kind: 'limited', then: 'the wait in ms' },
  { kind: 'no_balance', then: 'nothing' },
  { kind: 'quota', then: 'nothing' },
  { kind: 'replay', then: 'nothing' },
  { kind: 'denied', then: 'nothing' },
  { kind: 'no_credits', then: 'nothing (the account joins the dirty set: its next flush pass checks its balance against PostgreSQL)' },
] as const

type Positions<T extends readonly Field[]> = { readonly [F in T[number] as F['name']]: number }

const positions = <T extends readonly Field[]>(fields: T, first: number) =>
  Object.fromEntries(fields.map((f, i) => [f.name, first + i])) as Positions<T>

/** Where each head field is in a request: the script's h[F.now] and so on (1-based, after the count). */
export const F = positions(HEAD, 1)
/** Offset of each field within an epoch group. */
export const E = positions(EPOCH, 0)
/** Offset of each field within a bucket group. */
export const B = positions(BUCKET, 0)

/** A field's name in the script: nonceKey is NONCE_KEY. */
export const luaName = (name: string) => name.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase()

/**
 * The tables as Lua locals (`local F_NONCE_KEY = 8`), prepended to a script that reads the wire; the
 * groups start at h[HEAD_WIDTH + 1].
 */
export const luaConstants = [
  ...HEAD.map((f) => `local F_${luaName(f.name)} = ${F[f.name]}`),
  `local HEAD_WIDTH = ${HEAD.length}`,
  ...EPOCH.map((f) => `local EPOCH_${luaName(f.name)} = ${E[f.name]}`),
  `local EPOCH_WIDTH = ${EPOCH.length}`,
  ...BUCKET.map((f) => `local BUCKET_${luaName(f.name)} = ${B[f.name]}`),
  `local BUCKET_WIDTH = ${BUCKET.length}`,
  ...REPLIES.map((r, code) => `local R_${luaName(r.kind)} = ${code}`),
].join('\n')

/**
 * Lua: a bucket's time (GCRA, memory.ts's bucketTime) as of `now`, its interval `t` and capacity `cap`:
 * the stored time, or `now` when that is past or missing; one more than CLOCK_STEP_MS further ahead than
 * a bucket emptied now is read as a bucket with one token left.
 */
export const luaBucketTime = `
local function bucket_time(tat, now, t, cap)
  if not tat or tat < now then return now end
  if tat > now + cap * t + ${CLOCK_STEP_MS} then return now + (cap - 1) * t end
  return tat
end
`

/**
 * Lua that writes an epoch key anew, kept EPOCH_TTL_MS: Redis's clock in ms, or `after` + 1 when that is
 * later (a bump of a key that is there). A key that expired comes back at a time at least EPOCH_TTL_MS
 * after its last write, past any value it held (short of 3.6 million bumps within the hour), and never
 * at 0: no entry read before can match it. Made text with '%d', as Redis 7.2 would write a large number
 * in exponent form.
 */
export const luaNewEpoch = `
local epoch_clock
local function new_epoch(key, after)
  if not epoch_clock then
    local t = redis.call('TIME')
    epoch_clock = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local e = epoch_clock
  if after and after >= e then e = after + 1 end
  redis.call('SET', key, string.format('%d', e), 'PX', ${EPOCH_TTL_MS})
  return e
end
`

/**
 * Lua that reads ARGV[1] into `names` (the keys, the first `read_count` of them the ones the call reads)
 * and `reqs` (each request's numbers as h[1..count]).
 */
export const luaUnpack = `
local packed = ARGV[1]
local key_count, read_count, pos = struct.unpack('<I4I4', packed, 1)
local names = {}
for i = 1, key_count do names[i], pos = struct.unpack('<Hc0', packed, pos) end
local reqs = {}
local formats = {}
while pos <= #packed do
  local count = struct.unpack('<d', packed, pos)
  local format = formats[count]
  if not format then
    format = '<' .. string.rep('d', count)
    formats[count] = format
  end
  local h = { struct.unpack(format, packed, pos + 8) }
  pos = h[count + 1]
  reqs[#reqs + 1] = h
end
`

/**
 * What a key is to the script: one it reads (in the call's one MGET, before anything is written), one it
 * only writes, or the account id (a name the dirty set holds, no key).
 */
type KeyRole = 'read' | 'written' | 'id'

/**
 * One authorize call's single argument: each distinct key once, the ones the script reads first, then
 * the numbers of every request. The call runs on its shard's slot (authorize-script.ts), so a request
 * with a key of another shard is refused here before any of it is written.
 */
export class AuthorizeArgs {
  /** The keys the script reads: positions 1 to reads.length. */
  readonly #reads: string[] = []
  /** The other names, after the reads: a position here is -(index + 1) until packed() places them. */
  readonly #others: string[] = []
  readonly #positions = new Map<string, number>()
  readonly #numbers: number[] = []
  /** Where #numbers holds a position among #others, in ascending order. */
  readonly #otherRefs: number[] = []
  readonly #prefix: string

  /**
   * `readEveryKey` (a cluster): the script reads every key of the call, the ones it only writes too, so
   * that a key this node does not serve (a slot being migrated) fails the MGET before anything is
   * written, instead of a write half-way through that Redis would keep. One Redis has no such keys.
   */
  constructor(
    readonly shard: Shard,
    private readonly readEveryKey = false,
  ) {
    this.#prefix = shardPrefix(shard)
  }

  /** Writes the name's position at n[at], placing the name the first time; `name` undefined writes 0. */
  #key(at: number, name: string | undefined, role: KeyRole): void {
    const n = this.#numbers
    if (name === undefined) {
      n[at] = 0
      return
    }
    const read = role === 'read' || (role === 'written' && this.readEveryKey)
    let position = this.#positions.get(name)
    if (position === undefined) {
      if (role !== 'id' && !name.startsWith(this.#prefix)) throw new Error(`a key of another shard than ${this.shard} in one authorize call`)
      position = read ? this.#reads.push(name) : -this.#others.push(name)
      this.#positions.set(name, position)
    } else if (position > 0 !== read) {
      // The script would read it for one request and not for another: roles come from its kind of key.
      throw new Error('a name used both as a key the script reads and as one it does not in one authorize call')
    }
    n[at] = position
    if (position < 0) this.#otherRefs.push(at)
  }

  /** Appends one request; throws, adding nothing, when it names a key of another shard. */
  add(a: AuthorizeInput): void {
    const at = this.#numbers.length
    try {
      this.#add(a, at)
    } catch (err) {
      this.#numbers.length = at
      const refs = this.#otherRefs
      while (refs.length > 0 && (refs[refs.length - 1] as number) >= at) refs.pop()
      throw err
    }
  }

  #add(a: AuthorizeInput, at: number): void {
    const { ceiling, nonce, charge, shard } = a
    if (shard !== this.shard) throw new Error(`a request of shard ${shard} in a call of shard ${this.shard}`)
    const counter = charge?.counter
    const n = this.#numbers
    // n[at] is the count, n[at + i] the script's h[i]. Written in the table's order, each write appends.
    n[at] = 0
    n[at + F.now] = a.nowMs
    n[at + F.epochCount] = a.epochs.length
    n[at + F.bucketCount] = a.buckets.length
    n[at + F.deny] = a.deny ? 1 : 0
    this.#key(at + F.ceilingKey, ceiling?.key, 'written')
    n[at + F.ceilingLimit] = ceiling ? ceiling.limit : 0
    n[at + F.ceilingTtl] = ceiling ? ceiling.ttlSeconds : 0
    this.#key(at + F.nonceKey, nonce?.key, 'written')
    n[at + F.nonceTtl] = nonce ? nonce.ttlSeconds : 0
    this.#key(at + F.account, charge?.accountId, 'id')
    this.#key(at + F.balanceKey, charge ? keys.balance(shard, charge.accountId) : undefined, 'read')
    this.#key(at + F.pendingKey, charge ? keys.pendingCharges(shard, charge.accountId) : undefined, 'written')
    this.#key(at + F.dirtyKey, charge ? keys.dirtyAccounts(shard) : undefined, 'written')
    n[at + F.cost] = charge ? charge.cost : 0
    this.#key(at + F.counterKey, counter?.key, 'written')
    n[at + F.counterEvery] = counter ? counter.every : 0
    let group = at + HEAD.length + 1
    for (const e of a.epochs) {
      this.#key(group + E.key, e.key, 'read')
      n[group + E.expected] = e.expected
      group += EPOCH.length
    }
    const firstBucket = group
    for (const b of a.buckets) {
      this.#key(group + B.key, b.key, 'read')
      // The script takes each group's token from the bucket as the groups before it left it: a key named
      // twice would be taken from twice, its capacity checked for each alone.
      for (let g = firstBucket; g < group; g += BUCKET.length) {
        if (n[g + B.key] === n[group + B.key]) throw new Error('a request that names one bucket twice')
      }
      n[group + B.capacity] = b.capacity
      n[group + B.refillPerSecond] = b.refillPerSecond
      group += BUCKET.length
    }
    n[at] = group - at - 1
  }

  /**
   * The argument as one Buffer, because ioredis spends ~0.5 µs on each argument of a call, and a call
   * carries 3 to 9 keys a request; doubles because struct.unpack reads them exactly, ~1 µs a request
   * against ~3.5 for cjson. The other names go after the reads, and their positions with them.
   */
  packed(): Buffer {
    const readCount = this.#reads.length
    const names = this.#others.length === 0 ? this.#reads : [...this.#reads, ...this.#others]
    let size = 8 + this.#numbers.length * 8
    // A UTF-16 code unit is at most 3 bytes of UTF-8.
    for (const k of names) size += 2 + k.length * 3
    const out = Buffer.allocUnsafe(size)
    out.writeUInt32LE(names.length, 0)
    out.writeUInt32LE(readCount, 4)
    let at = 8
    for (const k of names) {
      const length = out.write(k, at + 2)
      out.writeUInt16LE(length, at)
      at += 2 + length
    }
    const n = this.#numbers
    const refs = this.#otherRefs
    let nextRef = 0
    for (let i = 0; i < n.length; i++) {
      let value = n[i] as number
      if (i === refs[nextRef]) {
        value = readCount - value
        nextRef++
      }
      at = out.writeDoubleLE(value, at)
    }
    return out.subarray(0, at)
  }
}

/**
 * Reads one request's answer from the script's integers at `at`; returns it and where the next starts.
 * `drops` is the shard's count of drops when the call went (Connection.dropsOf), which a charge's
 * refund checks with the shard's generation (chargedUnder).
 */
export function authorizeResult(flat: number[], at: number, drops: number): [AuthorizeResult, number] {
  const kind = REPLIES[flat[at] as number]?.kind
  switch (kind) {
    case 'ok':
      // flat[0] is the shard's generation the call ran under (authorize-script.ts).
      return [{ kind, charged: flat[at + 1] as number, chargedUnder: chargeMark(drops, String(flat[0])) }, at + 2]
    case 'stale': {
      const count = flat[at + 1] as number
      return [{ kind, epochs: flat.slice(at + 2, at + 2 + count) }, at + 2 + count]
    }
    case 'limited':
      return [{ kind, retryAfterMs: flat[at + 1] as number }, at + 2]
    case undefined:
      throw new Error(`unexpected authorize reply ${String(flat[at])}`)
    default:
      return [{ kind }, at + 1]
  }
}

/** What a charge's refund is checked against: the connection it was made on, and the shard's generation. */
const chargeMark = (drops: number, generation: string) => `${drops}/${generation}`

/** A chargedUnder's parts; null for one that is not a chargeMark. */
export function readChargeMark(chargedUnder: string): { drops: number; generation: string } | null {
  const slash = chargedUnder.indexOf('/')
  const drops = Number(chargedUnder.slice(0, slash))
  return slash > 0 && Number.isSafeInteger(drops) ? { drops, generation: chargedUnder.slice(slash + 1) } : null
}
