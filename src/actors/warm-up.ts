import { errorFields, log, logEvery } from '../lib/log'
import type { Shard, Snapshot } from '../store/store'
import { keys } from '../store/store'
import { licenseRecordBytes } from './license-cache'
import type { CachedLicense } from './load'

/** Licenses read per step: one key page, one store call, one row query. */
const PAGE = 1_000
/** The warm-up stops once the cache holds this share of its bound: the rest is left to the misses of live traffic. */
const FILL = 0.9
/** After a failed pass (PostgreSQL or the store unreachable at start), the next one. */
const RETRY_MS = 5_000
/**
 * Passes start at most once this often after the first two (the start and one refill go at once): a
 * store connection that keeps being replaced empties the cache each time, and a pass reads up to 90% of
 * CACHE_MAX_MB in every process, which would keep PostgreSQL and the server busy re-reading licenses
 * few requests ask for. Between passes, misses load as they are asked for.
 */
const PASS_EVERY_MS = 60_000
const PASS_BURST = 2

/** What the warm-up reads and where it puts it (the registry). */
export interface WarmUpWiring {
  /** Keys after `after` in key order, with their apps, at most `limit`. */
  keyPage(after: string, limit: number): Promise<{ key: string; appId: string }[]>
  /** The epochs of `keys` and the generation they were read under (Epochs.snapshot). */
  snapshot(epochKeys: string[]): Promise<Snapshot>
  /** The rows of `keys`, by key. */
  rows(licenseKeys: string[]): Promise<Map<string, CachedLicense>>
  /** The shard of the app's keys; null when the app is gone. */
  shardOfApp(appId: string): Promise<Shard | null>
  /** Moves the registry to a newer generation the warm-up read first, emptying it (without restarting the warm-up). */
  adopt(generation: number): void
  /** Caches a license read under the registry's current `generation` unless an entry for it is already there; whether it did. */
  keepIfMissing(appId: string, licenseKey: string, epoch: number, value: CachedLicense, generation: number): boolean
  /** Whether the cache may take `bytes` more (0: anything at all) and stay within `fill` of its byte bound. */
  hasRoom(fill: number, bytes: number): boolean
  /** The generation every entry is read under now; a change drops them all. */
  generation(): number
}

/**
 * Fills the license cache from PostgreSQL at start, and again after a store generation change emptied
 * it, up to most of CACHE_MAX_MB: a request for a license the cache holds costs no PostgreSQL read, so
 * with the licenses in play within the bound a license never validated before costs what a hot one
 * does, and a new or restarted instance does not send every first request to the database. The rule
 * that makes caching safe holds per page: its epochs are read before its rows. Runs in the background,
 * one page at a time, yielding between them; a failed pass is logged and tried again a little later.
 */
export class CacheWarmUp {
  #running: Promise<void> | null = null
  /** A pass is wanted: set by start(), taken by the loop in #passes, which checks it last before it ends. */
  #again = false
  #stopped = false
  #retry: ReturnType<typeof setTimeout> | null = null
  /** When the next pass may start without using the burst (GCRA over pass starts). */
  #nextPassAt = Number.NEGATIVE_INFINITY
  /** Licenses the pass under way (or the last one) cached. */
  #cachedThisPass = 0

  constructor(
    private readonly wiring: WarmUpWiring,
    private readonly timing = { retryMs: RETRY_MS, passEveryMs: PASS_EVERY_MS },
  ) {}

  /** Starts a pass, or asks the one under way to start over (its entries went with a generation change). */
  start(): void {
    if (this.#stopped) return
    this.#again = true
    if (this.#retry) clearTimeout(this.#retry)
    this.#retry = null
    // A pass under way takes the request itself (its loop asks for the turn of the next one).
    if (this.#running || this.#deferred()) return
    this.#running = this.#passes()
  }

  /** Resolves when no pass is under way. */
  async idle(): Promise<void> {
    while (this.#running) await this.#running
  }

  /** Ends the pass under way after its current page. */
  async stop(): Promise<void> {
    this.#stopped = true
    if (this.#retry) clearTimeout(this.#retry)
    await this.idle()
  }

  async #passes(): Promise<void> {
    try {
      while (this.#again && !this.#stopped) {
        this.#again = false
        const startedAt = performance.now()
        let cached: number | null
        try {
          cached = await this.#pass()
        } catch (err) {
          if (this.#stopped) return
          // A pass that failed before caching anything (PostgreSQL still starting) read next to nothing:
          // it does not take a turn, so the retry comes after retryMs, not after the pacing's minute.
          if (this.#cachedThisPass === 0) this.#nextPassAt -= this.timing.passEveryMs
          logEvery('warn', 'license cache warm-up failed: licenses load on first use until a later pass', () => errorFields(err))
          this.#startIn(this.timing.retryMs)
          return
        }
        if (this.#stopped) return
        if (cached !== null) log.info('license cache warmed', { licenses: cached, ms: Math.round(performance.now() - startedAt) })
        // Asked again (cut short, or a start() meanwhile): the next pass waits for its turn, so passes cut
        // short by generation changes repeat at most once an interval.
        if (this.#again && !this.#stopped && this.#deferred()) return
      }
    } finally {
      // In the same step as the loop's last look at #again (the pass awaited at least once, so
      // start() has assigned #running by now): a start() from here on begins a new pass.
      this.#running = null
    }
  }

  /** Whether the next pass must wait for its turn (then start() is called when it comes); otherwise the pass is counted. */
  #deferred(): boolean {
    const now = performance.now()
    const { passEveryMs } = this.timing
    const next = Math.max(this.#nextPassAt, now)
    const wait = next - now - (PASS_BURST - 1) * passEveryMs
    if (wait <= 0) {
      this.#nextPassAt = next + passEveryMs
      return false
    }
    logEvery('warn', 'license cache warm-up deferred: the cache keeps being emptied (store reconnects); licenses load on first use meanwhile', () => ({ waitMs: Math.round(wait) }))
    this.#startIn(wait)
    return true
  }

  #startIn(ms: number): void {
    this.#retry = setTimeout(() => this.start(), ms)
    this.#retry.unref()
  }

  /** One pass from the first key; the licenses it cached, or null when a generation change cut it short. */
  async #pass(): Promise<number | null> {
    const w = this.wiring
    let generation: number | null = null
    let after = ''
    this.#cachedThisPass = 0
    while (!this.#stopped && !this.#again && w.hasRoom(FILL, 0)) {
      const page = await w.keyPage(after, PAGE)
      if (page.length === 0) break
      after = page[page.length - 1]!.key
      const shards = new Map<string, Shard | null>()
      for (const { appId } of page) if (!shards.has(appId)) shards.set(appId, await w.shardOfApp(appId))
      const present = page.filter(({ appId }) => shards.get(appId) != null)
      if (present.length === 0) continue
      const read = await w.snapshot(present.map(({ key, appId }) => keys.licenseEpoch(shards.get(appId)!, key)))
      // Read here first: the registry moves to it now, so a request that learns of it later finds it adopted.
      if (read.generation > w.generation()) w.adopt(read.generation)
      if (generation !== null && read.generation !== generation) return this.#cutShort()
      generation = read.generation
      const rows = await w.rows(present.map(({ key }) => key))
      if (w.generation() > generation) return this.#cutShort()
      for (const [i, { key, appId }] of present.entries()) {
        const row = rows.get(key)
        // Gone since the page was read, or moved to another app: the first request loads it as a miss would.
        if (row?.appId !== appId) continue
        // Checked per entry, with the entry's own size: a page must not push out what an earlier one cached.
        if (!w.hasRoom(FILL, licenseRecordBytes(appId, key, row))) return this.#cachedThisPass
        if (w.keepIfMissing(appId, key, read.epochs[i] ?? 0, row, generation)) this.#cachedThisPass++
      }
    }
    return this.#again ? null : this.#cachedThisPass
  }

  /** The entries of this pass's generation went with it: the pass starts over under the new one. */
  #cutShort(): null {
    this.#again = true
    return null
  }
}
