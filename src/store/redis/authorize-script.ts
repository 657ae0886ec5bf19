import { BUCKET_SLACK_MS, HEARTBEAT_COUNT_TTL_SECONDS } from '../store'
import { luaBucketTime, luaConstants, luaNewEpoch, luaUnpack } from './wire'

// The public requests of one call (see authorize.ts), each checked in order (AuthorizeInput in
// store.ts documents the order of one request's checks; memory.ts mirrors it), answered as one array.
// The script works on the batch, not on each request: every key it reads is read once by one MGET, each
// request sees the changes of those before it in a Lua table, and each bucket or balance is written
// once at the end, so the ones many requests share (the caller's IP, the account) cost one write per
// call; nonces, counters and ceilings are written as each request goes.
// KEYS[1] is the generation key of the call's shard, the one key declared: a cluster runs the call on
// its slot, and every key in ARGV[1] carries the same shard tag (wire.ts checks it; Redis refuses a
// script that reaches another slot). First of all the script checks that generation against ARGV[2],
// the value this process read its epochs under, '' for a shard it has not read yet (then none of its
// entries came from it); ARGV[3] is written when the key is missing. On any other value it answers -1
// and the current value and runs nothing, since epochs that restarted after a data loss would make old
// cache entries look fresh. Otherwise the answer is the generation, then each request's (REPLIES).
// ARGV[1] is the batch in the wire format of wire.ts, whose tables name every h[...] read here.
export const AUTHORIZE = `${luaConstants}
local gen = redis.call('GET', KEYS[1])
if not gen then
  gen = ARGV[3]
  redis.call('SET', KEYS[1], gen)
end
if ARGV[2] ~= '' and gen ~= ARGV[2] then return { -1, gen } end
${luaUnpack}
${luaBucketTime}
${luaNewEpoch}
local val = {}
local bucket_ex = {}
local spent = {}
local charged_by = {}
-- Redis turns a number argument of redis.call into text with a full-precision conversion, ~2,500
-- instructions each (callgrind, 2.5% of the script a request): the expiries, whole seconds and few
-- distinct values a call, are made text once each ('%d': exact for any of them, where tostring would
-- write a large one as 1e+15). The time-valued ones (a bucket's arrival time) stay numbers.
local texts = {}
local function as_text(seconds)
  local s = texts[seconds]
  if not s then
    s = string.format('%d', seconds)
    texts[seconds] = s
  end
  return s
end

-- The keys the call reads are names[1..read_count] (wire.ts puts them first): one MGET, in slices (unpack
-- has a stack limit), before anything is written.
for from = 1, read_count, 500 do
  local to = math.min(from + 499, read_count)
  local v = redis.call('MGET', unpack(names, from, to))
  for i = from, to do val[i] = tonumber(v[i - from + 1]) end
end

-- Each request's answer, appended to out as integers (REPLIES in wire.ts). Written inline in one loop,
-- "repeat ... until true" standing in for the continue Lua 5.1 lacks (break ends a request): a function
-- call per request, a closure call per answer and a table per request's buckets cost ~0.6-0.8 µs a
-- request in-script (5-8% of the script), and the script's time is what the server processes wait on.
local out = { gen }
local n = 1
for _, h in ipairs(reqs) do
  repeat
    local now, ne, nb = h[F_NOW], h[F_EPOCH_COUNT], h[F_BUCKET_COUNT]
    local e = HEAD_WIDTH + 1
    local b = e + EPOCH_WIDTH * ne
    local stale = false
    for i = e, b - 1, EPOCH_WIDTH do
      local k = h[i + EPOCH_KEY]
      -- An epoch key that expired (or never was) is written anew: compared as 0, an entry read while it
      -- was missing would match it again after a change and its expiry (luaNewEpoch).
      if not val[k] then val[k] = new_epoch(names[k]) end
      if val[k] ~= h[i + EPOCH_EXPECTED] then stale = true end
    end
    if stale then
      out[n + 1] = R_STALE
      out[n + 2] = ne
      n = n + 2
      for i = e, b - 1, EPOCH_WIDTH do
        n = n + 1
        out[n] = val[h[i + EPOCH_KEY]]
      end
      break
    end
    local bal = h[F_BALANCE_KEY]
    if bal > 0 and not val[bal] then
      n = n + 1
      out[n] = R_NO_BALANCE
      break
    end
    local ceil = h[F_CEILING_KEY]
    if ceil > 0 then
      local count = redis.call('INCR', names[ceil])
      if count == 1 then redis.call('EXPIRE', names[ceil], h[F_CEILING_TTL]) end
      if count > h[F_CEILING_LIMIT] then
        n = n + 1
        out[n] = R_QUOTA
        break
      end
    end
    if nb > 0 then
      -- All of a request's buckets or none: the first pass finds the longest wait, the second takes.
      local last = b + BUCKET_WIDTH * nb - 1
      local short = 0
      for j = b, last, BUCKET_WIDTH do
        local k = h[j + BUCKET_KEY]
        local t = 1000 / h[j + BUCKET_REFILL_PER_SECOND]
        local tat = bucket_time(val[k], now, t, h[j + BUCKET_CAPACITY])
        if val[k] and val[k] > tat then
          -- Read as a clock stepped back: kept so, whatever the other buckets answer. Left as it was by a
          -- request another bucket refused, it was held again by the time that one let the client by.
          val[k] = tat
          bucket_ex[k] = math.ceil((tat - now) / 1000) + 1
        end
        local over = tat + t - now - h[j + BUCKET_CAPACITY] * t
        if over > ${BUCKET_SLACK_MS} then
          over = math.ceil(over)
          if over > short then short = over end
        end
      end
      if short > 0 then
        out[n + 1] = R_LIMITED
        out[n + 2] = short
        n = n + 2
        break
      end
      for j = b, last, BUCKET_WIDTH do
        local k = h[j + BUCKET_KEY]
        local t = 1000 / h[j + BUCKET_REFILL_PER_SECOND]
        local tat = bucket_time(val[k], now, t, h[j + BUCKET_CAPACITY]) + t
        val[k] = tat
        -- Kept until a second after the bucket is full again (a missing key reads as full), in whole
        -- seconds so that one text serves most keys of a call (as_text).
        bucket_ex[k] = math.ceil((tat - now) / 1000) + 1
      end
    end
    local nonce = h[F_NONCE_KEY]
    if nonce > 0 and not redis.call('SET', names[nonce], '1', 'NX', 'EX', as_text(h[F_NONCE_TTL])) then
      n = n + 1
      out[n] = R_REPLAY
      break
    end
    if h[F_DENY] == 1 then
      n = n + 1
      out[n] = R_DENIED
      break
    end
    local cost = 0
    if bal > 0 then
      cost = h[F_COST]
      local ctr = h[F_COUNTER_KEY]
      if ctr > 0 then
        local count = redis.call('INCR', names[ctr])
        -- Its lifetime starts with each cycle's first count: an EXPIRE a count cost ~2 µs a heartbeat.
        if (count - 1) % h[F_COUNTER_EVERY] == 0 then redis.call('EXPIRE', names[ctr], '${HEARTBEAT_COUNT_TTL_SECONDS}') end
        if count % h[F_COUNTER_EVERY] ~= 0 then cost = 0 end
      end
      if cost > 0 then
        if val[bal] < cost then
          if ctr > 0 then redis.call('DECR', names[ctr]) end
          redis.call('SADD', names[h[F_DIRTY_KEY]], names[h[F_ACCOUNT]])
          n = n + 1
          out[n] = R_NO_CREDITS
          break
        end
        val[bal] = val[bal] - cost
        spent[bal] = (spent[bal] or 0) + cost
        charged_by[bal] = h
      end
    end
    out[n + 1] = R_OK
    out[n + 2] = cost
    n = n + 2
  until true
end

for k, ex in pairs(bucket_ex) do
  redis.call('SET', names[k], val[k], 'EX', as_text(ex))
end
for bal, amount in pairs(spent) do
  local h = charged_by[bal]
  redis.call('DECRBY', names[bal], amount)
  if redis.call('INCRBY', names[h[F_PENDING_KEY]], amount) == amount then
    redis.call('SADD', names[h[F_DIRTY_KEY]], names[h[F_ACCOUNT]])
  end
end
return out
`
