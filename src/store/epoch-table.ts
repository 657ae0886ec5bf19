/** Slots of the table: 2^18 counters, 1 MB, allocated at the first bump. */
const SLOTS = 1 << 18

/**
 * The in-process store's license epochs. One map entry per license ever created or changed (~200 bytes
 * each, outside CACHE_MAX_MB) grew an embedded server with every license it ever issued; here a license's
 * epoch is the counter of the slot its key hashes to, in a table of fixed size. Licenses that share a
 * slot share bumps: a bump of one makes the others' cached entries stale too, which costs them a reload
 * and never serves stale data, since a counter only grows (no value comes back for an entry to match).
 */
export class EpochTable {
  #counters: Uint32Array | null = null

  get(key: string): number {
    return this.#counters?.[slotOf(key)] ?? 0
  }

  bump(key: string): void {
    this.#counters ??= new Uint32Array(SLOTS)
    this.#counters[slotOf(key)]! += 1
  }

  /** Every epoch back to 0, as a Redis that lost its data reads them. */
  clear(): void {
    this.#counters = null
  }
}

/** FNV-1a over the key's UTF-16 units, to a slot. */
function slotOf(key: string): number {
  let h = 0x811c9dc5
  for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key.charCodeAt(i), 0x01000193)
  return (h >>> 0) & (SLOTS - 1)
}
