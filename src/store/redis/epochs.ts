import { randomUUID } from 'node:crypto'
import { type Admission, type Epochs, keys, shardOfKey, type Snapshot } from '../store'
import type { Connection, Script } from './connection'

const BUMP = `
for i = 1, #KEYS do redis.call('INCR', KEYS[i]) end
return #KEYS
`

// KEYS: the shard's generation key, the epoch keys, then the admission bucket when ARGV[2] is given,
// all of one shard. ARGV: a fresh generation id (written when the key is missing), then the bucket's
// now, capacity and refill per second. Answers the generation, the wait in ms (0: admitted) and, when
// admitted, each epoch.
const SNAPSHOT = `
local gen = redis.call('GET', KEYS[1])
if not gen then
  gen = ARGV[1]
  redis.call('SET', KEYS[1], gen)
end
local last = #KEYS
if ARGV[2] then
  local now, t = tonumber(ARGV[2]), 1000 / tonumber(ARGV[4])
  local tat = math.max(tonumber(redis.call('GET', KEYS[last])) or now, now) + t
  local over = tat - now - tonumber(ARGV[3]) * t
  if over > 1e-6 then return { gen, math.ceil(over) } end
  redis.call('SET', KEYS[last], tat, 'PX', math.ceil(tat - now) + 1000)
  last = last - 1
end
local out = { gen, 0 }
for i = 2, last do out[#out + 1] = tonumber(redis.call('GET', KEYS[i]) or '0') end
return out
`

export interface EpochCommands {
  lsSnapshot(n: number, ...keysAndArgs: (string | number)[]): Promise<[string, number, ...number[]]>
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

  async snapshot(epochKeys: readonly string[], admission?: Admission): Promise<Snapshot> {
    this.conn.failFastWhenLost()
    const shard = shardOfKey(epochKeys[0] ?? admission?.key ?? '')
    const sentAt = this.conn.generation
    const args: (string | number)[] = [keys.generation(shard), ...epochKeys]
    if (admission) args.push(admission.key)
    args.push(randomUUID())
    if (admission) args.push(admission.nowMs, admission.capacity, admission.refillPerSecond)
    const [seen, waitMs, ...epochs] = await this.conn.redis.lsSnapshot(epochKeys.length + (admission ? 2 : 1), ...args)
    if (waitMs > 0) return { kind: 'limited', retryAfterMs: waitMs }
    return { kind: 'ok', generation: this.conn.observe(shard, seen, sentAt), epochs }
  }
}
