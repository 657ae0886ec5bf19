import { TurnBatcher } from '../lib/batcher'
import { withTimeout } from '../lib/with-timeout'
import type { Admission, Shard, Store } from '../store/store'
import { keys } from '../store/store'
import type { Entry } from './bounded'
import { type CachedLicense, StoreUnavailable } from './load'

/**
 * How long the next batch waits for the one in flight. One batch goes at a time, for the turn's misses
 * to share it; but one held up (a query on a connection that stopped answering, which the driver's stall
 * check finds after 10 to 15 s, or waiting for a pool that long writes hold) would hold every app's
 * misses behind it. Past this the next batch goes anyway, and the one held up answers its own callers
 * whenever it ends. The service's reads take milliseconds.
 */
export const NEXT_BATCH_AFTER_MS = 2_000

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
}

/**
 * The license misses of one turn of the event loop, served together: one store call per shard (one
 * on a single Redis) reads their epochs (each miss taking its own admission token first; a refused one
 * loads nothing and does not hold up the others), then one PostgreSQL query reads every admitted row,
 * a key asked twice once.
 * The rule that makes caching safe holds per entry: its epoch was read before its row, and it is kept
 * under the generation that read saw. One batch in flight: misses arriving meanwhile, or in the turn
 * after it is served, travel in the next (which waits at most `nextBatchAfterMs`).
 */
export class LicenseLoads {
  readonly #batcher = new TurnBatcher<Miss>((misses) => this.#serve(misses), { oneInFlight: true })

  constructor(
    private readonly wiring: LicenseLoadsWiring,
    private readonly nextBatchAfterMs = NEXT_BATCH_AFTER_MS,
  ) {}

  /** Caches the license (present or absent) unless `admission`'s bucket is empty. */
  ensure(appId: string, shard: Shard, licenseKey: string, admission?: Admission): Promise<LicenseRead> {
    return new Promise((done, fail) => this.#batcher.add({ appId, shard, licenseKey, admission, done, fail }))
  }

  async #serve(misses: Miss[]): Promise<void> {
    const served = this.#load(misses).catch((err: unknown) => {
      // Settles whoever is still waiting (a settled promise ignores it): no caller hangs on a bug here.
      for (const m of misses) m.fail(err)
    })
    await withTimeout(served, this.nextBatchAfterMs)
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

  /** The rows of `admitted`; when the one query fails, each key alone, so one bad key fails only its own callers. */
  async #rows(admitted: string[]): Promise<Map<string, CachedLicense | Error>> {
    if (admitted.length === 0) return new Map()
    try {
      return await this.wiring.load(admitted)
    } catch (err) {
      if (admitted.length === 1) return new Map([[admitted[0]!, asError(err)]])
    }
    const alone = await Promise.allSettled(admitted.map((key) => this.wiring.loadOne(key)))
    const rows = new Map<string, CachedLicense | Error>()
    alone.forEach((r, i) => {
      const key = admitted[i]!
      if (r.status === 'rejected') rows.set(key, asError(r.reason))
      else if (r.value) rows.set(key, r.value)
    })
    return rows
  }
}

const asError = (err: unknown) => (err instanceof Error ? err : new Error(String(err)))
