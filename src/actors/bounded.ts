import { limitSubject } from '../lib/ip'

/** A Map that forgets its oldest entry when full: enough to bound memory, no LRU bookkeeping per hit. */
export class BoundedMap<V> extends Map<string, V> {
  constructor(
    private readonly limit: number,
    private readonly onEvict?: (value: V) => void,
  ) {
    super()
  }

  override set(key: string, value: V): this {
    if (!this.has(key) && this.size >= this.limit) {
      const oldest = this.entries().next().value
      if (oldest !== undefined) {
        this.delete(oldest[0])
        this.onEvict?.(oldest[1])
      }
    }
    return super.set(key, value)
  }
}

/**
 * A cache entry is valid while the store's epoch for it still equals `epoch` (read before the load)
 * and the store is still in the generation the whole registry was read under (AppActors.generation).
 */
export interface Entry<T> {
  epoch: number
  value: T | null
}

/** Who holds entries under a SharedBound: told when the bound drops one of them. */
export interface Holder {
  evicted(key: string, entry: Held): void
}

/** An entry as the bound keeps it: itself, so no second object or composite key per entry. */
export interface Held extends Entry<unknown> {
  readonly holder: Holder
  readonly key: string
  readonly bytes: number
  /** Released by its holder or evicted: its place in the queue is skipped. */
  gone: boolean
}

/**
 * Entries oldest first. An array, not a Set or Map: taking the oldest of a Set from which many were
 * deleted walks past every deleted slot until the table is rebuilt (measured at ~12 µs per eviction
 * with 10^4 entries churning). Gone entries are skipped when reached, and swept out once they
 * outnumber the live ones; the slots taken from the front are cut off once they are half the array.
 * So the array stays within about twice the live entries.
 */
class Queue {
  #items: (Held | undefined)[] = []
  #head = 0
  #gone = 0
  /** Entries not gone. */
  size = 0

  push(held: Held): void {
    this.#items.push(held)
    this.size++
  }

  /** The oldest entry not gone, taken out; undefined when none is left. */
  shift(): Held | undefined {
    let taken: Held | undefined
    while (this.#head < this.#items.length) {
      const held = this.#items[this.#head]
      this.#items[this.#head++] = undefined
      if (held && !held.gone) {
        this.size--
        taken = held
        break
      }
      this.#gone--
    }
    // Left in place, one slot stayed for every entry ever evicted: a cache churning at its bound grew
    // the array without end.
    if (this.#head > 1024 && this.#head * 2 > this.#items.length) {
      this.#items = this.#items.slice(this.#head)
      this.#head = 0
    }
    return taken
  }

  /** One entry still queued is gone (released by its holder): the sweep counts it. */
  left(): void {
    this.size--
    if (++this.#gone > 1024 && this.#gone > this.size) {
      this.#items = this.#items.filter((held) => held !== undefined && !held.gone)
      this.#head = 0
      this.#gone = 0
    }
  }

  *[Symbol.iterator](): Generator<Held> {
    for (let i = this.#head; i < this.#items.length; i++) {
      const held = this.#items[i]
      if (held && !held.gone) yield held
    }
  }
}

/**
 * The entries of many holders (each actor's app and licenses) under one bound in bytes, oldest out
 * first. Entries whose value is null (keys that name nothing) are bounded apart, by count: anyone can
 * send made-up keys, and they must never push real entries out.
 */
export class SharedBound {
  #present = new Queue()
  #absent = new Queue()
  #bytes = 0

  constructor(
    readonly maxBytes: number,
    private readonly absentLimit: number,
  ) {}

  /** Bytes held by present entries (their estimates). */
  get bytes(): number {
    return this.#bytes
  }

  /** Entries held, present and absent. */
  get size(): number {
    return this.#present.size + this.#absent.size
  }

  /**
   * Wraps `entry` of `holder`'s `key`, estimated at `bytes`, and makes room for it, oldest out first;
   * the caller stores what this returns. The newest stays even alone over the bound.
   */
  hold<T>(holder: Holder, key: string, entry: Entry<T>, bytes: number): Entry<T> {
    const absent = entry.value === null
    const held: Held = { epoch: entry.epoch, value: entry.value, holder, key, bytes: absent ? 0 : bytes, gone: false }
    const queue = absent ? this.#absent : this.#present
    queue.push(held)
    this.#bytes += held.bytes
    while (queue.size > 1 && (absent ? queue.size > this.absentLimit : this.#bytes > this.maxBytes)) {
      const oldest = queue.shift()!
      oldest.gone = true
      this.#bytes -= oldest.bytes
      oldest.holder.evicted(oldest.key, oldest)
    }
    return held as Entry<T>
  }

  /** The holder dropped `entry` itself (replaced or forgotten): its room is free again. */
  release(entry: Entry<unknown> | undefined): void {
    const held = entry as Held | undefined
    if (!held || held.gone || held.holder === undefined) return
    held.gone = true
    this.#bytes -= held.bytes
    ;(held.value === null ? this.#absent : this.#present).left()
  }

  /** Drops every entry, telling each holder. */
  clear(): void {
    for (const queue of [this.#present, this.#absent]) {
      for (const held of queue) {
        held.gone = true
        held.holder.evicted(held.key, held)
      }
    }
    this.#present = new Queue()
    this.#absent = new Queue()
    this.#bytes = 0
  }
}

/**
 * A made-up name (an app id, an API key) costs a PostgreSQL read before anything can refuse it: there is
 * nothing yet whose limits apply. So each IP may look up names that turn out absent `perMinute` times
 * a minute (a token bucket: each lookup takes a token before its read, and one that found its name, or
 * that a store or database outage cut short, gives it back; real clients never spend it). Taken before
 * the read, not after: lookups of one IP at once would each find the token none of them had spent yet.
 * Lookups of one name by one IP at once share a read and its token: the first logins of an app's
 * clients behind one address, after a restart, cost one token, not one each.
 * Kept per process on purpose: no store round trip on a cold path, and n processes bound the database's
 * load to n times this. An IPv6 address counts as its /64 (limitSubject).
 */
/**
 * A refill time more than a minute (a whole refill) ahead of now was read before the clock stepped back:
 * kept, it refilled nothing until the clock caught up, an hour for an hour's step. Read as now, with a
 * token, as the store's buckets read a time that far ahead (bucketTime).
 */
const steppedBack = (at: number, nowMs: number) => at > nowMs + 60_000

export class MissBudget {
  readonly #buckets: BoundedMap<{ tokens: number; at: number }>
  /** The lookups under way, by address and name: at most one per pair. */
  readonly #lookups = new Map<string, Promise<unknown>>()

  constructor(
    private readonly perMinute: number,
    ips: number,
  ) {
    this.#buckets = new BoundedMap(ips)
  }

  #tokens(subject: string, nowMs: number): number {
    const bucket = this.#buckets.get(subject)
    if (!bucket) return this.perMinute
    if (steppedBack(bucket.at, nowMs)) return Math.max(1, bucket.tokens)
    return Math.min(this.perMinute, bucket.tokens + (Math.max(0, nowMs - bucket.at) * this.perMinute) / 60_000)
  }

  // Refilled up to the later of the two times: a clock read before another caller's must not refill twice.
  #set(subject: string, tokens: number, nowMs: number): void {
    const at = this.#buckets.get(subject)?.at ?? nowMs
    this.#buckets.set(subject, { tokens, at: steppedBack(at, nowMs) ? nowMs : Math.max(nowMs, at) })
  }

  /**
   * Runs `lookup` of `name` for `ip` with one of its tokens, given back unless `absent` says the lookup
   * found nothing; a lookup of the same name by the same address under way is joined instead, and its
   * answer taken: `name` names the kind of lookup too, where lookups of one thing answer differently. Null,
   * running nothing, when the address has no token left. `clock` reads the time the lookup ends.
   */
  async lookUp<T>(
    ip: string,
    name: string,
    nowMs: number,
    clock: () => number,
    lookup: () => Promise<T>,
    absent: (found: T) => boolean,
  ): Promise<{ found: T } | null> {
    const subject = limitSubject(ip)
    const key = `${subject}\n${name}`
    const running = this.#lookups.get(key) as Promise<T> | undefined
    if (running) return { found: await running }
    const tokens = this.#tokens(subject, nowMs)
    if (tokens < 1) return null
    this.#set(subject, tokens - 1, nowMs)
    const run = (async () => {
      let spent = false
      try {
        const found = await lookup()
        spent = absent(found)
        return found
      } finally {
        this.#lookups.delete(key)
        if (!spent) this.#set(subject, Math.min(this.perMinute, this.#tokens(subject, clock()) + 1), clock())
      }
    })()
    this.#lookups.set(key, run)
    return { found: await run }
  }

  /** How long until `ip` may look up again (0 when it may now). */
  retryAfterMs(ip: string, nowMs: number): number {
    const subject = limitSubject(ip)
    // Refilling starts once the clock reaches the time kept (read before a clock step of under a minute).
    const at = this.#buckets.get(subject)?.at ?? nowMs
    const lead = steppedBack(at, nowMs) ? 0 : Math.max(0, at - nowMs)
    return Math.max(0, Math.ceil(((1 - this.#tokens(subject, nowMs)) * 60_000) / this.perMinute + lead))
  }
}
