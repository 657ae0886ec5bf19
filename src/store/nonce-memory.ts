/** How many generations a nonce outlives its own in: it is remembered for at least that many spans. */
const SPANS = 7

/**
 * The most nonces remembered at once, about 50 bytes each (some 250 MB): past it the oldest generation
 * is forgotten before its time (NonceMemory's `forgotEarly`), so that a client holding an app's secret
 * (which ships inside the client program) cannot grow the process without bound, one nonce per validate.
 */
export const MAX_REMEMBERED_NONCES = 5_000_000

/** The claims of one span of time: their keys' hashes, as numbers (no string or object per claim). */
type Generation = Set<number>

/**
 * The nonces the in-process store has seen, each for at least its TTL. One entry per key in a generic
 * map cost about 375 bytes a nonce, kept 7 days, and a minute's sweep walked them all on the request
 * path: a client sending one validate after another with fresh nonces grew the process by a gigabyte a
 * week per IP address. Here each TTL has a ring of SPANS + 1 generations of TTL/SPANS each, which are
 * dropped whole, and a claim is a 53-bit hash of its key in one of them: ~50 bytes, no sweep. A
 * different nonce of the same hash (one chance in 2^53 per nonce remembered) reads as a replay.
 */
export class NonceMemory {
  /** Per TTL (ms): generation index (time ÷ span) → its claims; at most SPANS + 1 of them. */
  readonly #rings = new Map<number, Map<number, Generation>>()
  #remembered = 0

  constructor(
    private readonly forgotEarly: (count: number) => void = () => {},
    private readonly maxRemembered = MAX_REMEMBERED_NONCES,
  ) {}

  /** How many claims are remembered now. */
  get size(): number {
    return this.#remembered
  }

  /** Claims `key` for at least `ttlMs` from `now`: false when it is claimed already. */
  claim(key: string, ttlMs: number, now: number): boolean {
    const span = Math.max(1, Math.ceil(ttlMs / SPANS))
    const current = Math.floor(now / span)
    let ring = this.#rings.get(ttlMs)
    if (!ring) this.#rings.set(ttlMs, (ring = new Map()))
    for (const [index, generation] of ring) {
      if (index < current - SPANS) {
        ring.delete(index)
        this.#remembered -= generation.size
      }
    }
    const hash = Number(Bun.hash.wyhash(key) & 0x1f_ffff_ffff_ffffn)
    for (const generation of ring.values()) if (generation.has(hash)) return false
    if (this.#remembered >= this.maxRemembered) this.#forgetOldest()
    let generation = ring.get(current)
    if (!generation) ring.set(current, (generation = new Set()))
    generation.add(hash)
    this.#remembered++
    return true
  }

  clear(): void {
    this.#rings.clear()
    this.#remembered = 0
  }

  /** The oldest generation of any TTL, dropped before its time. */
  #forgetOldest(): void {
    let oldest: { ring: Map<number, Generation>; index: number; since: number } | null = null
    for (const [ttlMs, ring] of this.#rings) {
      const span = Math.max(1, Math.ceil(ttlMs / SPANS))
      for (const index of ring.keys()) if (!oldest || index * span < oldest.since) oldest = { ring, index, since: index * span }
    }
    if (!oldest) return
    const generation = oldest.ring.get(oldest.index)!
    oldest.ring.delete(oldest.index)
    this.#remembered -= generation.size
    this.forgotEarly(generation.size)
  }
}
