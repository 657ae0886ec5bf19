import { type BegunFlush, type CreditCharges, type CreditState, type Credits, keys, type Shard, shardOfKey } from '../store'
import type { Connection, Script } from './connection'
import { log } from '../../lib/log'
import { readChargeMark } from './wire'

// KEYS: balance, pending, flushing, account epoch, credit sequence. ARGV: expected epoch, expected flush
// id ('' for none), '1' when PostgreSQL already has that flush, reconciled balance, reconciled sequence,
// expected sequence (a flush begun and ended since the caller read the reconciled balance moved it).
const LOAD_BALANCE = `
if tonumber(redis.call('GET', KEYS[4]) or '0') ~= tonumber(ARGV[1]) then return 0 end
local seq = tonumber(redis.call('GET', KEYS[5]) or '0')
if seq ~= tonumber(ARGV[6]) then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 1 end
if seq < tonumber(ARGV[5]) then
  redis.call('DEL', KEYS[2], KEYS[3])
  redis.call('SET', KEYS[5], ARGV[5])
  redis.call('SET', KEYS[1], math.max(0, tonumber(ARGV[4])))
  return 1
end
local id, inflight = '', 0
local f = redis.call('GET', KEYS[3])
if f then id, inflight = string.match(f, '^(.*):(-?%d+)$') end
if id ~= ARGV[2] then return 0 end
if ARGV[3] == '1' then inflight = 0 end
local live = tonumber(ARGV[4]) - tonumber(redis.call('GET', KEYS[2]) or '0') - tonumber(inflight)
-- Refunds not flushed yet may carry it past the ceiling a top-up reaches (accounts/service.ts): held there.
redis.call('SET', KEYS[1], math.min(9007199254740991, math.max(0, live)))
return 1
`

// KEYS: balance, account epoch, credit sequence, pending, flushing. ARGV: reconciled sequence.
const CREDITS_CHANGING = `
if tonumber(redis.call('GET', KEYS[3]) or '0') < tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[4], KEYS[5])
  redis.call('SET', KEYS[3], ARGV[1])
end
redis.call('INCR', KEYS[2])
redis.call('DEL', KEYS[1])
return redis.call('INCR', KEYS[3])
`

// KEYS: the heartbeat counter, its shard's generation key. ARGV: the generation the count was made in.
// A counter gone meanwhile (its month without heartbeats ended) stays gone: DECR would make it -1 with
// no expiry.
const UNCOUNT = `
if redis.call('GET', KEYS[2]) ~= ARGV[1] or redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('DECR', KEYS[1])
return 1
`

// KEYS: balance, pending, dirty set, the shard's generation key. ARGV: account, n, the generation the
// charge was made under. Another generation: the store lost the charge with its data (a restart empty, a
// failover), so PostgreSQL never had it; given back, its refund would be a credit never paid.
const REFUND = `
if redis.call('GET', KEYS[4]) ~= ARGV[3] then return 0 end
-- Held at the ceiling a top-up may reach (accounts/service.ts).
if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('INCRBY', KEYS[1], ARGV[2]) > 9007199254740991 then
  redis.call('SET', KEYS[1], '9007199254740991', 'KEEPTTL')
end
redis.call('DECRBY', KEYS[2], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[1])
return 1
`

// KEYS: pending, flushing, credit sequence, balance, account epoch. ARGV: new flush id, reconciled
// sequence. Behind PostgreSQL's sequence, the account's credit keys are older than what PostgreSQL holds:
// they go (the epoch moves, so a seed under way starts over).
const BEGIN_FLUSH = `
local seq = tonumber(redis.call('GET', KEYS[3]) or '0')
if seq < tonumber(ARGV[2]) then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[4])
  redis.call('SET', KEYS[3], ARGV[2])
  redis.call('INCR', KEYS[5])
  return {'behind', 0}
end
local f = redis.call('GET', KEYS[2])
if f then return {f, seq} end
local p = tonumber(redis.call('GET', KEYS[1]) or '0')
if p == 0 then return {false, seq} end
seq = redis.call('INCR', KEYS[3])
redis.call('DECRBY', KEYS[1], p)
local record = ARGV[1] .. ':' .. p
redis.call('SET', KEYS[2], record)
return {record, seq}
`

// KEYS: flushing, pending, dirty set. ARGV: flush id, account. The account stays dirty while another
// flush's record is there (an end that came late, after another instance had begun the next flush).
const END_FLUSH = `
local f = redis.call('GET', KEYS[1])
if f and string.sub(f, 1, #ARGV[1] + 1) == ARGV[1] .. ':' then
  redis.call('DEL', KEYS[1])
  f = false
end
if not f and tonumber(redis.call('GET', KEYS[2]) or '0') == 0 then redis.call('SREM', KEYS[3], ARGV[2]) end
return 1
`

export interface CreditCommands {
  lsLoadBalance(
    bal: string,
    pend: string,
    fl: string,
    ep: string,
    seq: string,
    expectedEpoch: number,
    expectedFlush: string,
    committed: '0' | '1',
    reconciled: number,
    reconciledSeq: number,
    expectedSeq: number,
  ): Promise<number>
  lsCreditsChanging(bal: string, ep: string, seq: string, pend: string, fl: string, reconciledSeq: number): Promise<unknown>
  lsRefund(bal: string, pend: string, dirty: string, gen: string, account: string, n: number, generation: string): Promise<number>
  lsUncount(counter: string, gen: string, generation: string): Promise<number>
  lsBeginFlush(pend: string, fl: string, seq: string, bal: string, ep: string, id: string, reconciledSeq: number): Promise<unknown>
  lsEndFlush(fl: string, pend: string, dirty: string, id: string, account: string): Promise<number>
}

export const creditScripts: { [name in keyof CreditCommands]: Script } = {
  lsLoadBalance: { numberOfKeys: 5, lua: LOAD_BALANCE },
  lsCreditsChanging: { numberOfKeys: 5, lua: CREDITS_CHANGING },
  lsRefund: { numberOfKeys: 4, lua: REFUND },
  lsUncount: { numberOfKeys: 2, lua: UNCOUNT },
  lsBeginFlush: { numberOfKeys: 5, lua: BEGIN_FLUSH },
  lsEndFlush: { numberOfKeys: 3, lua: END_FLUSH },
}

/** A flush record "<flush id>:<amount>" read. */
function flushRecord(record: string): { id: string; amount: number } {
  const colon = record.lastIndexOf(':')
  if (colon < 0) throw new Error('unexpected flush record in the store')
  return { id: record.slice(0, colon), amount: storedCount(record.slice(colon + 1), 'flush amount') }
}

/**
 * A count the scripts keep as text (a balance, an epoch, a flush's amount). Text that is not one (from
 * a broken or impostor server) is the store failing: read as NaN it answered 500 from a schema check,
 * and would have reached a flush to PostgreSQL.
 */
function storedCount(text: string, what: string): number {
  const n = Number(text)
  if (!Number.isSafeInteger(n)) throw new Error(`unexpected ${what} in the store`)
  return n
}

/** An account's credit keys, all in its shard, as each script takes them. */
function accountKeys(conn: Connection, accountId: string) {
  const shard = conn.shardOf(accountId)
  return {
    balance: keys.balance(shard, accountId),
    pending: keys.pendingCharges(shard, accountId),
    flushing: keys.flushing(shard, accountId),
    seq: keys.creditSeq(shard, accountId),
    epoch: keys.accountEpoch(shard, accountId),
    dirty: keys.dirtyAccounts(shard),
    generation: keys.generation(shard),
  }
}

export class RedisCredits implements Credits {
  constructor(private readonly conn: Connection<CreditCommands>) {}

  async loadBalance(accountId: string, seen: CreditState, reconciled: number, flushCommitted: boolean, reconciledSeq = 0): Promise<'ok' | 'stale'> {
    this.conn.failFastWhenLost()
    const k = accountKeys(this.conn, accountId)
    const done = await this.conn.redis.lsLoadBalance(
      k.balance,
      k.pending,
      k.flushing,
      k.epoch,
      k.seq,
      seen.epoch,
      seen.flushId ?? '',
      flushCommitted ? '1' : '0',
      reconciled,
      reconciledSeq,
      seen.seq,
    )
    return done === 1 ? 'ok' : 'stale'
  }

  async creditState(accountId: string): Promise<CreditCharges> {
    this.conn.failFastWhenLost()
    const k = accountKeys(this.conn, accountId)
    const [epoch, flushing, seq, pending] = await this.conn.redis.mget(k.epoch, k.flushing, k.seq, k.pending)
    const flush = flushing ? flushRecord(flushing) : null
    return {
      epoch: epoch ? storedCount(epoch, 'credit epoch') : 0,
      flushId: flush?.id ?? null,
      seq: seq ? storedCount(seq, 'credit sequence') : 0,
      pending: pending ? storedCount(pending, 'pending charges') : 0,
      flushing: flush?.amount ?? 0,
    }
  }

  async balance(accountId: string, reconciledSeq = 0): Promise<number | null> {
    this.conn.failFastWhenLost()
    const k = accountKeys(this.conn, accountId)
    const [v, seq] = await this.conn.redis.mget(k.balance, k.seq)
    if (v === null || v === undefined || (seq ? storedCount(seq, 'credit sequence') : 0) < reconciledSeq) return null
    return storedCount(v, 'balance')
  }

  async creditsChanging(accountId: string, reconciledSeq = 0): Promise<number> {
    this.conn.failFastWhenLost()
    const k = accountKeys(this.conn, accountId)
    const seq = await this.conn.redis.lsCreditsChanging(k.balance, k.epoch, k.seq, k.pending, k.flushing, reconciledSeq)
    return storedCount(String(seq), 'credit sequence')
  }

  async refund(accountId: string, n: number, chargedUnder: string): Promise<void> {
    this.conn.failFastWhenLost()
    const mark = readChargeMark(chargedUnder)
    // Made on a connection that dropped since: the server now may hold a copy of the data from before
    // the charge, with the same generation key; the charge counts as lost with it.
    if (!mark || mark.drops !== this.conn.dropsOf(this.conn.shardOf(accountId))) {
      // A line each, as for a refund that fails: each names credits an operator may want to give back.
      log.warn("a refund was dropped: Redis's connection dropped since its charge, which the data now there may not hold", { accountId, cost: n })
      return
    }
    const k = accountKeys(this.conn, accountId)
    await this.conn.redis.lsRefund(k.balance, k.pending, k.dirty, k.generation, accountId, n, mark.generation)
  }

  async uncount(counterKey: string, countedUnder: string): Promise<void> {
    this.conn.failFastWhenLost()
    // Unlike a refund, one made on a connection that dropped since still goes: a count kept by mistake
    // charges the client's repeat a call early, and one taken back from an older copy is a free call.
    const mark = readChargeMark(countedUnder)
    if (!mark) return
    await this.conn.redis.lsUncount(counterKey, keys.generation(shardOfKey(counterKey)), mark.generation)
  }

  async dirtyAccounts(shard: Shard): Promise<string[]> {
    this.conn.failFastWhenLost()
    return this.conn.redis.smembers(keys.dirtyAccounts(shard))
  }

  async beginFlush(accountId: string, newId: string, reconciledSeq = 0): Promise<BegunFlush> {
    this.conn.failFastWhenLost()
    const k = accountKeys(this.conn, accountId)
    const reply = await this.conn.redis.lsBeginFlush(k.pending, k.flushing, k.seq, k.balance, k.epoch, newId, reconciledSeq)
    if (!Array.isArray(reply) || reply.length !== 2) throw new Error('unexpected flush reply in the store')
    const [record, seq] = reply as unknown[]
    if (record === 'behind') return 'behind'
    if (record === null) return null
    if (typeof record !== 'string') throw new Error('unexpected flush record in the store')
    return { ...flushRecord(record), seq: storedCount(String(seq), 'credit sequence') }
  }

  async endFlush(accountId: string, id: string): Promise<void> {
    this.conn.failFastWhenLost()
    const k = accountKeys(this.conn, accountId)
    await this.conn.redis.lsEndFlush(k.flushing, k.pending, k.dirty, id, accountId)
  }
}
