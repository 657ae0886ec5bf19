import { randomUUID } from 'node:crypto'
import { BUCKET_SLACK_MS, type EpochRead, type Epochs, keys, shardOfKey, type Snapshot, type Snapshots } from '../store'
import type { Connection, Script } from './connection'
import { luaBucketTime, luaNewEpoch } from './wire'

const BUMP = `${luaNewEpoch}
for i = 1, #KEYS do new_epoch(KEYS[i], tonumber(redis.call('GET', KEYS[i]))) end
return #KEYS
`

// KEYS: the shard's generation key, then per read its epoch key and, when it has an admission bucket, its bucket key,
// all of one shard. ARGV: a fresh generation id (written when the key is missing), then per read three
// values: the bucket's now ('' without a bucket), capacity and refill per second. Answers the generation,
// then per read its epoch (written anew when missing), or minus the wait in ms when its bucket had no
// token (then its epoch is not read).
const SNAPSHOT = `${luaBucketTime}${luaNewEpoch}
local gen = redis.call('GET', KEYS[1])
if not gen then
  gen = ARGV[1]
  redis.call('SET', KEYS[1], gen)
end
local out = { gen }
local k = 2
for a = 2, #ARGV, 3 do
  local now, wait = tonumber(ARGV[a]), 0
  if now then
    local bucket, t, cap = KEYS[k + 1], 1000 / tonumber(ARGV[a + 2]), tonumber(ARGV[a + 1])
    local tat = bucket_time(tonumber(redis.call('GET', bucket)), now, t, cap) + t
    local over = tat - now - cap * t
    if over > ${BUCKET_SLACK_MS} then
      wait = math.ceil(over)
    else
      redis.call('SET', bucket, tat, 'PX', math.ceil(tat - now) + 1000)
    end
  end
  if wait > 0 then
    out[#out + 1] = -wait
  else
    out[#out + 1] = tonumber(redis.call('GET', KEYS[k])) or new_epoch(KEYS[k])
  end
  k = k + (now and 2 or 1)
end
return out
`

export interface EpochCommands {
  lsSnapshot(n: number, ...keysAndArgs: (string | number)[]): Promise<[string, ...number[]]>
  lsBump(n: number, ...keys: string[]): Promise<number>
}

export const epochScripts: { [name in keyof EpochCommands]: Script } = {
  lsSnapshot: { lua: SNAPSHOT },
  lsBump: { lua: BUMP },
}

/** Keys grouped by shard, each group a call of its own on a cluster (one group on a single Redis). */
function byShard(epochKeys: readonly string[]): string[][] {
  const groups = new Map<string, string[]>()
  for (const key of epochKeys) {
    const shard = shardOfKey(key)
    const group = groups.get(shard)
    if (group) group.push(key)
    else groups.set(shard, [key])
  }
  return [...groups.values()]
}

export class RedisEpochs implements Epochs {
  constructor(private readonly conn: Connection<EpochCommands>) {}

  async epochs(epochKeys: readonly string[]): Promise<number[]> {
    if (epochKeys.length === 0) return []
    this.conn.failFastWhenLost()
    const found = new Map<string, number>()
    await Promise.all(
      byShard(epochKeys).map(async (group) => {
        const values = await this.conn.redis.mget(...group)
        group.forEach((key, i) => found.set(key, Number(values[i] ?? 0)))
      }),
    )
    return epochKeys.map((key) => found.get(key) ?? 0)
  }

  async bump(epochKeys: readonly string[]): Promise<void> {
    this.conn.failFastWhenLost()
    await Promise.all(byShard(epochKeys).map((group) => this.conn.redis.lsBump(group.length, ...group)))
  }

  async snapshot(epochKeys: readonly string[]): Promise<Snapshot> {
    const { generation, reads } = await this.snapshotEach(epochKeys.map((key) => ({ key })))
    return { generation, epochs: reads.map((read) => (read.kind === 'ok' ? read.epoch : 0)) }
  }

  /** One call per shard of the reads (one on a single Redis); the generation answered is the lowest of the calls'. */
  async snapshotEach(reads: readonly EpochRead[]): Promise<Snapshots> {
    this.conn.failFastWhenLost()
    const groups = new Map<string, number[]>()
    reads.forEach(({ key }, i) => {
      const shard = shardOfKey(key)
      const group = groups.get(shard)
      if (group) group.push(i)
      else groups.set(shard, [i])
    })
    if (groups.size === 0) groups.set('', [])
    const answers: Snapshots['reads'] = new Array(reads.length)
    const generations = await Promise.all(
      [...groups].map(async ([shard, indexes]) => {
        const sentAt = this.conn.generation
        const keyArgs: string[] = [keys.generation(shard)]
        const args: (string | number)[] = [randomUUID()]
        for (const i of indexes) {
          const { key, admission } = reads[i]!
          keyArgs.push(key)
          if (admission) {
            keyArgs.push(admission.key)
            args.push(admission.nowMs, admission.capacity, admission.refillPerSecond)
          } else {
            args.push('', 0, 0)
          }
        }
        const [seen, ...found] = await this.conn.redis.lsSnapshot(keyArgs.length, ...keyArgs, ...args)
        indexes.forEach((i, j) => {
          const n = found[j] ?? 0
          answers[i] = n < 0 ? { kind: 'limited', retryAfterMs: -n } : { kind: 'ok', epoch: n }
        })
        return this.conn.observe(shard, seen, sentAt)
      }),
    )
    return { generation: Math.min(...generations), reads: answers }
  }
}
