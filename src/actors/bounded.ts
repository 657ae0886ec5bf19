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

interface Slot<T> {
  owner: Map<string, Entry<T>>
  key: string
}

/**
 * The entries of many owners (each actor's license cache) under one bound, oldest out first. Entries
 * whose value is null (keys that name nothing) are bounded apart: anyone can send made-up keys, and
 * they must never push real entries out.
 */
export class SharedBound<T> {
  readonly #present: BoundedMap<Slot<T>>
  readonly #absent: BoundedMap<Slot<T>>

  constructor(limit: number, absentLimit: number) {
    const evict = (slot: Slot<T>) => slot.owner.delete(slot.key)
    this.#present = new BoundedMap(limit, evict)
    this.#absent = new BoundedMap(absentLimit, evict)
  }

  /** Sets `owner`'s entry for `key`; `ownerId` tells owners apart (one key may sit in two of them). */
  set(ownerId: string, owner: Map<string, Entry<T>>, key: string, entry: Entry<T>): void {
    const slot = `${ownerId} ${key}`
    const [into, other] = entry.value === null ? [this.#absent, this.#present] : [this.#present, this.#absent]
    other.delete(slot)
    if (!into.has(slot)) into.set(slot, { owner, key })
    owner.set(key, entry)
  }

  delete(ownerId: string, owner: Map<string, Entry<T>>, key: string): void {
    if (!owner.delete(key)) return
    const slot = `${ownerId} ${key}`
    this.#present.delete(slot)
    this.#absent.delete(slot)
  }

  clear(): void {
    for (const slot of this.#present.values()) slot.owner.clear()
    for (const slot of this.#absent.values()) slot.owner.clear()
    this.#present.clear()
    this.#absent.clear()
  }
}
