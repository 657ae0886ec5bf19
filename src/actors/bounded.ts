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
}

/**
 * The entries of many holders (each actor's app and licenses) under one bound in bytes, oldest out
 * first. Entries whose value is null (keys that name nothing) are bounded apart, by count: anyone can
 * send made-up keys, and they must never push real entries out.
 */
export class SharedBound {
  readonly #present = new Set<Held>()
  readonly #absent = new Set<Held>()
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

  /** Wraps `entry` of `holder`'s `key`, estimated at `bytes`, and makes room for it; the caller stores what this returns. */
  hold<T>(holder: Holder, key: string, entry: Entry<T>, bytes: number): Entry<T> {
    const held: Held = { epoch: entry.epoch, value: entry.value, holder, key, bytes: entry.value === null ? 0 : bytes }
    if (entry.value === null) {
      this.#absent.add(held)
      for (const oldest of this.#absent) {
        if (this.#absent.size <= this.absentLimit) break
        this.#evict(oldest)
      }
    } else {
      this.#present.add(held)
      this.#bytes += held.bytes
      for (const oldest of this.#present) {
        // The newest stays even alone over the bound: its caller is about to store it.
        if (this.#bytes <= this.maxBytes || oldest === held) break
        this.#evict(oldest)
      }
    }
    return held as Entry<T>
  }

  #evict(held: Held): void {
    this.release(held)
    held.holder.evicted(held.key, held)
  }

  /** The holder dropped `entry` itself (replaced or forgotten): its room is free again. */
  release(entry: Entry<unknown> | undefined): void {
    const held = entry as Held | undefined
    if (!held) return
    if (this.#present.delete(held)) this.#bytes -= held.bytes
    else this.#absent.delete(held)
  }

  /** Drops every entry, telling each holder. */
  clear(): void {
    for (const set of [this.#present, this.#absent]) {
      for (const held of set) held.holder.evicted(held.key, held)
      set.clear()
    }
    this.#bytes = 0
  }
}

/**
 * A made-up app id costs PostgreSQL reads before anything can refuse it: there is no app yet whose
 * limits apply. So each IP may find absent apps `perMinute` times a minute (a token bucket charged
 * only by a lookup that found no app: real clients, and lookups cut short by a store or database
 * outage, never spend it); past that its uncached app ids are answered invalid_app without a read.
 * Kept per process on purpose: no store round trip on a cold path, and n processes bound the
 * database's load to n times this. Concurrent lookups of one IP may overdraw it by their number.
 */
export class AbsentAppBudget {
  readonly #buckets: BoundedMap<{ tokens: number; at: number }>

  constructor(
    private readonly perMinute: number,
    ips: number,
  ) {
    this.#buckets = new BoundedMap(ips)
  }

  #tokens(ip: string, nowMs: number): number {
    const bucket = this.#buckets.get(ip)
    if (!bucket) return this.perMinute
    return Math.min(this.perMinute, bucket.tokens + (Math.max(0, nowMs - bucket.at) * this.perMinute) / 60_000)
  }

  allows(ip: string, nowMs: number): boolean {
    return this.#tokens(ip, nowMs) >= 1
  }

  /** A lookup by `ip` found no app. */
  charge(ip: string, nowMs: number): void {
    this.#buckets.set(ip, { tokens: Math.max(0, this.#tokens(ip, nowMs) - 1), at: nowMs })
  }
}
