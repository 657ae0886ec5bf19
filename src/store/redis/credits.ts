import { type CreditState, type Credits, keys } from '../store'
import type { Connection, Script } from './connection'

// KEYS: balance, pending, flushing, account epoch. ARGV: expected epoch, expected flush id ('' for
// none), '1' when PostgreSQL already has that flush, reconciled balance.
const LOAD_BALANCE = `
if tonumber(redis.call('GET', KEYS[4]) or '0') ~= tonumber(ARGV[1]) then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 1 end
local id, inflight = '', 0
local f = redis.call('GET', KEYS[3])
if f then id, inflight = string.match(f, '^(.*):(-?%d+)$') end
if id ~= ARGV[2] then return 0 end
if ARGV[3] == '1' then inflight = 0 end
local live = tonumber(ARGV[4]) - tonumber(redis.call('GET', KEYS[2]) or '0') - tonumber(inflight)
redis.call('SET', KEYS[1], math.max(0, live))
return 1
`

// KEYS: balance, account epoch. ARGV: n.
const CREDITS_ADDED = `
redis.call('INCR', KEYS[2])
local live = redis.call('GET', KEYS[1])
if live then redis.call('SET', KEYS[1], math.max(0, tonumber(live) + tonumber(ARGV[1]))) end
return 1
`

// KEYS: balance, pending, dirty set. ARGV: account, n.
const REFUND = `
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('INCRBY', KEYS[1], ARGV[2]) end
redis.call('DECRBY', KEYS[2], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[1])
return 1
`

// KEYS: pending, flushing. ARGV: new flush id.
const BEGIN_FLUSH = `
local f = redis.call('GET', KEYS[2])
if f then return f end
local p = tonumber(redis.call('GET', KEYS[1]) or '0')
if p == 0 then return false end
redis.call('DECRBY', KEYS[1], p)
local record = ARGV[1] .. ':' .. p
redis.call('SET', KEYS[2], record)
return record
`

// KEYS: flushing, pending, dirty set. ARGV: flush id, account.
const END_FLUSH = `
local f = redis.call('GET', KEYS[1])
if f and string.sub(f, 1, #ARGV[1] + 1) == ARGV[1] .. ':' then redis.call('DEL', KEYS[1]) end
if tonumber(redis.call('GET', KEYS[2]) or '0') == 0 then redis.call('SREM', KEYS[3], ARGV[2]) end
return 1
`

export interface CreditCommands {
  lsLoadBalance(
    bal: string,
    pend: string,
    fl: string,
    ep: string,
    expectedEpoch: number,
    expectedFlush: string,
    committed: '0' | '1',
    reconciled: number,
  ): Promise<number>
  lsCreditsAdded(bal: string, ep: string, n: number): Promise<number>
  lsRefund(bal: string, pend: string, dirty: string, account: string, n: number): Promise<number>
  lsBeginFlush(pend: string, fl: string, id: string): Promise<string | null>
  lsEndFlush(fl: string, pend: string, dirty: string, id: string, account: string): Promise<number>
}

export const creditScripts: { [name in keyof CreditCommands]: Script } = {
  lsLoadBalance: { numberOfKeys: 4, lua: LOAD_BALANCE },
  lsCreditsAdded: { numberOfKeys: 2, lua: CREDITS_ADDED },
  lsRefund: { numberOfKeys: 3, lua: REFUND },
  lsBeginFlush: { numberOfKeys: 2, lua: BEGIN_FLUSH },
  lsEndFlush: { numberOfKeys: 3, lua: END_FLUSH },
}

/** The id of a flush record "<flush id>:<amount>". */
const flushIdOf = (record: string) => record.slice(0, record.lastIndexOf(':'))

export class RedisCredits implements Credits {
  constructor(private readonly conn: Connection<CreditCommands>) {}

  async loadBalance(accountId: string, seen: CreditState, reconciled: number, flushCommitted: boolean): Promise<'ok' | 'stale'> {
    this.conn.failFastWhenLost()
    const done = await this.conn.redis.lsLoadBalance(
      keys.balance(accountId),
      keys.pendingCharges(accountId),
      keys.flushing(accountId),
      keys.accountEpoch(accountId),
      seen.epoch,
      seen.flushId ?? '',
      flushCommitted ? '1' : '0',
      reconciled,
    )
    return done === 1 ? 'ok' : 'stale'
  }

  async creditState(accountId: string): Promise<CreditState> {
    this.conn.failFastWhenLost()
    const [epoch, flushing] = await this.conn.redis.mget(keys.accountEpoch(accountId), keys.flushing(accountId))
    return { epoch: Number(epoch ?? 0), flushId: flushing ? flushIdOf(flushing) : null }
  }

  async balance(accountId: string): Promise<number | null> {
    this.conn.failFastWhenLost()
    const v = await this.conn.redis.get(keys.balance(accountId))
    return v === null ? null : Number(v)
  }

  async creditsAdded(accountId: string, n: number): Promise<void> {
    this.conn.failFastWhenLost()
    await this.conn.redis.lsCreditsAdded(keys.balance(accountId), keys.accountEpoch(accountId), n)
  }

  async refund(accountId: string, n: number): Promise<void> {
    this.conn.failFastWhenLost()
    await this.conn.redis.lsRefund(keys.balance(accountId), keys.pendingCharges(accountId), keys.dirtyAccounts, accountId, n)
  }

  async dirtyAccounts(): Promise<string[]> {
    this.conn.failFastWhenLost()
    return this.conn.redis.smembers(keys.dirtyAccounts)
  }

  async beginFlush(accountId: string, newId: string): Promise<{ id: string; amount: number } | null> {
    this.conn.failFastWhenLost()
    const record = await this.conn.redis.lsBeginFlush(keys.pendingCharges(accountId), keys.flushing(accountId), newId)
    if (!record) return null
    return { id: flushIdOf(record), amount: Number(record.slice(record.lastIndexOf(':') + 1)) }
  }

  async endFlush(accountId: string, id: string): Promise<void> {
    this.conn.failFastWhenLost()
    await this.conn.redis.lsEndFlush(
      keys.flushing(accountId),
      keys.pendingCharges(accountId),
      keys.dirtyAccounts,
      id,
      accountId,
    )
  }
}
