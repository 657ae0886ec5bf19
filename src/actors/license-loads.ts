import { TurnBatcher } from '../lib/batcher'
import { DeadlineExceeded, withDeadline } from '../lib/with-timeout'
import type { Admission, Shard, Store } from '../store/store'
import { keys } from '../store/store'
import type { Entry } from './bounded'
import { type CachedLicense, StoreUnavailable } from './load'

/**
 * How long a batch waits for its rows on PostgreSQL. One batch is in flight at a time, so a query on a
 * connection that stopped answering (found out by the driver's stall check after 10 to 15 s) would hold
 * up every app's misses behind it: they fail at this deadline instead, and the next batch goes on
 * another connection. The service's reads take milliseconds.
 */
export const ROWS_DEADLINE_MS = 2_000

/** What a license miss came to: cached (present or absent), or refused by its admission bucket. */
export type LicenseRead = { kind: 'ok' } | { kind: 'limited'; retryAfterMs: number }

interface Miss {
  appId: string
  /** The app's shard, which its license's epoch key carries. */
  shard: Shard
  licenseKey: string
  admission: Admission | undefined
  done: (read: LicenseRead) => void
  fail: (err: unknown) => void
}

/** Where the misses' answers come from and go to (the registry). */
export interface LicenseLoadsWiring {
  store: Store
  /** The licenses of `keys` from PostgreSQL, in one query. */
  load(keys: readonly string[]): Promise<Map<string, CachedLicense>>
  /** Loads one license alone: a batch whose query failed retries its keys one by one. */
  loadOne(key: string): Promise<CachedLicense | null>
  /** Caches what was read under `generation`, under `appId` (the app the caller asked under). */
  keep(appId: string, licenseKey: string, entry: Entry<CachedLicense>, generation: number): void
  /** How long a read of rows may take (ROWS_DEADLINE_MS); null: as long as it takes. */
  rowsDeadlineMs: number | null
}

/**
 * The license misses of one turn of the event loop, served together: one store call per shard (one
 * on a single Redis) reads their epochs (each miss taking its own admission token first; a refused one
 * loads nothing and does not hold up the others), then one PostgreSQL query reads every admitted row,
 * a key asked twice once.
 * The rule that makes caching safe holds per entry: its epoch was read before its row, and it is kept
 * under the generation that read saw. One batch in flight: misses arriving meanwhile, or in the turn
 * after it is served, travel in the next.
 */
export class LicenseLoads {
  readonly #batcher = new TurnBatcher<Miss>((misses) => this.#serve(misses), { oneInFlight: true })

  constructor(private readonly wiring: LicenseLoadsWiring) {}

  /** Caches the license (present or absent) unless `admission`'s bucket is empty. */
  ensure(appId: string, shard: Shard, licenseKey: string, admission?: Admission): Promise<LicenseRead> {
    return new Promise((done, fail) => this.#batcher.add({ appId, shard, licenseKey, admission, done, fail }))
  }

  async #serve(misses: Miss[]): Promise<void> {
    try {
      await this.#load(misses)
    } catch (err) {
      // Settles whoever is still waiting (a settled promise ignores it): no caller hangs on a bug here.
      for (const m of misses) m.fail(err)
    }
  }

  async #load(misses: Miss[]): Promise<void> {
    const { store, keep } = this.wiring
    const byShard = new Map<Shard, Miss[]>()
    for (const m of misses) {
      const group = byShard.get(m.shard)
      if (group) group.push(m)
      else byShard.set(m.shard, [m])
    }
    // A store call per shard, as snapshotEach would make one per shard anyway, but each with its own
    // deadline and outcome: on a cluster a node that fails or stalls fails its own shards' misses, not
    // every miss of the turn.
    const served = await Promise.all(
      [...byShard.values()].map((group) =>
        store.snapshotEach(group.map((m) => ({ key: keys.licenseEpoch(m.shard, m.licenseKey), admission: m.admission }))).then(
          (snapshot) => ({ group, snapshot }),
          (err: unknown) => {
            const unavailable = new StoreUnavailable(err)
            for (const m of group) m.fail(unavailable)
            return null
          },
        ),
      ),
    )
    const admitted = new Set<string>()
    for (const read of served) {
      read?.group.forEach((m, i) => {
        if (read.snapshot.reads[i]?.kind === 'ok') admitted.add(m.licenseKey)
      })
    }
    const rows = await this.#rows([...admitted])
    for (const read of served) {
      if (!read) continue
      const { group, snapshot } = read
      group.forEach((m, i) => {
        const epochRead = snapshot.reads[i]!
        if (epochRead.kind === 'limited') return m.done(epochRead)
        const row = rows.get(m.licenseKey)
        if (row instanceof Error) return m.fail(row)
        keep(m.appId, m.licenseKey, { epoch: epochRead.epoch, value: row ?? null }, snapshot.generation)
        m.done(epochRead)
      })
    }
  }

  /**
   * The rows of `admitted`; when the one query fails, each key alone, so one bad key fails only its own
   * callers. A query past its deadline fails them all: read alone, each would wait as long.
   */
  async #rows(admitted: string[]): Promise<Map<string, CachedLicense | Error>> {
    if (admitted.length === 0) return new Map()
    try {
      return await this.#within(this.wiring.load(admitted))
    } catch (err) {
      if (admitted.length === 1 || err instanceof DeadlineExceeded) return new Map(admitted.map((key) => [key, asError(err)]))
    }
    const alone = await Promise.allSettled(admitted.map((key) => this.#within(this.wiring.loadOne(key))))
    const rows = new Map<string, CachedLicense | Error>()
    alone.forEach((r, i) => {
      const key = admitted[i]!
      if (r.status === 'rejected') rows.set(key, asError(r.reason))
      else if (r.value) rows.set(key, r.value)
    })
    return rows
  }

  #within<T>(read: Promise<T>): Promise<T> {
    const ms = this.wiring.rowsDeadlineMs
    return ms === null ? read : withDeadline(read, ms, 'a read of licenses')
  }
}

const asError = (err: unknown) => (err instanceof Error ? err : new Error(String(err)))
