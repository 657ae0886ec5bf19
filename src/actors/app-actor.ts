import type { Database, Tx } from '../db/client'
import { transactionKnown } from '../db/commit-outcome'
import type { EventBus } from '../delivery/outbox'
import type { Entry, Held, Holder, SharedBound } from './bounded'
import { type Invalidator, type NotedInvalidation, noteInvalidation } from './invalidate'
import type { LicenseCache } from './license-cache'
import { appBytes, type CachedApp } from './load'
import { Mailbox } from './mailbox'
import { SeatBinder } from './seat-binder'
import { applySelfban, type SelfbanDone, type SelfbanWish } from './selfban'

/** What a change touched: what AppActor.note records in its transaction, and publish acts on after the commit. */
export interface Changed {
  /** The app's cached state: its row (settings, lists, variables), its active signing key, whether a webhook wants license.validated. */
  app?: boolean
  /** Licenses whose rows changed (created, updated, deleted, bound). */
  licenses?: readonly string[]
  /** Outbox events were recorded with the change: the dispatcher has work. */
  events?: boolean
}

/** What every actor of a process shares, owned by the registry (AppActors). */
export interface ActorHost {
  database: Database
  bus: EventBus
  clock: () => number
  invalidator: Invalidator
  /** Bounds the app entries of all actors, in bytes; the licenses take the rest of the same bound. */
  bound: SharedBound
  /** The license entries of every app (LicenseCache). */
  licenses: LicenseCache
}

/**
 * One app's live state in this process and the one way it changes here. Every change of the app's
 * data (licenses, seats, lists, variables, signing keys, webhooks, selfban) runs through its mailbox, one at a time, and is
 * published by `publish`; the client endpoints read the state it holds (settings, lists, variables,
 * signing key), and its licenses in the process's LicenseCache, without PostgreSQL. Across processes
 * its copies are kept honest by the store's epochs, and its writes by SQL conditions and row locks, not
 * by the mailbox.
 */
export class AppActor implements Holder {
  #app: Entry<CachedApp> | undefined = undefined
  readonly mailbox = new Mailbox()
  readonly #seats: SeatBinder

  constructor(
    readonly id: string,
    private readonly host: ActorHost,
  ) {
    this.#seats = new SeatBinder(this, host.database, host.clock)
  }

  /** Nothing queued or running: the registry may let the actor go. */
  get idle(): boolean {
    return this.mailbox.idle && this.#seats.pending === 0
  }

  /** The app as last loaded; undefined until loaded or after a change or the bound dropped it. */
  get app(): Entry<CachedApp> | undefined {
    return this.#app
  }

  setApp(entry: Entry<CachedApp> | undefined): void {
    const { bound } = this.host
    bound.release(this.#app)
    this.#app = entry && bound.hold(this, this.id, entry, entry.value ? appBytes(entry.value) : 0)
    this.host.licenses.trim()
  }

  /** The shared bound dropped this actor's app entry. */
  evicted(_key: string, entry: Held): void {
    if (entry === this.#app) this.#app = undefined
  }

  /**
   * Runs `work` in one transaction, after every earlier change of this app, records in that
   * transaction what `changed` says it touched (note), and publishes it once committed, also when
   * the COMMIT's answer was lost and PostgreSQL says it committed (transactionKnown).
   */
  async write<T>(work: (tx: Tx) => Promise<T>, changed: (result: T) => Changed): Promise<T> {
    const { result, change, noted } = await this.mailbox.run(() =>
      transactionKnown(this.host.database, async (tx) => {
        const result = await work(tx)
        const change = changed(result)
        return { result, change, noted: await this.note(tx, change) }
      }),
    )
    await this.publish(change, noted ? [noted] : [])
    return result
  }

  /** Records in a change's transaction which cached entries it touched (the invalidation outbox). */
  note(tx: Tx, { app = false, licenses = [] }: Changed): Promise<NotedInvalidation | null> {
    return noteInvalidation(tx, { appId: this.id, app, licenseKeys: licenses })
  }

  /**
   * After a commit, the one publishing path: this actor drops its copies of what changed (the next
   * request reloads them), the dispatcher is woken for the events the change recorded (they are
   * committed: their delivery need not wait for the store), and every process's copies are
   * invalidated through the store's epochs, from what the change's transaction noted.
   */
  async publish({ app = false, licenses = [], events = false }: Changed, noted: readonly NotedInvalidation[]): Promise<void> {
    if (app) this.setApp(undefined)
    for (const key of licenses) this.host.licenses.delete(this.id, key)
    if (events) this.host.bus.notify()
    await this.host.invalidator.bump(noted)
  }

  /** Binds `hwid` to a free seat of the license (see SeatBinder): true when this call bound it. */
  bindSeat(licenseKey: string, hwid: string): Promise<boolean> {
    return this.#seats.bind(licenseKey, hwid)
  }

  /** Revokes the license and appends to the blacklists in one transaction; reports what changed. */
  selfban(licenseKey: string, want: SelfbanWish): Promise<SelfbanDone> {
    return this.write(
      (tx) => applySelfban(tx, this.id, licenseKey, want, new Date(this.host.clock())),
      (done) => ({
        app: done.blacklistHwid || done.blacklistIp,
        licenses: done.revokeLicense ? [licenseKey] : [],
        events: done.revokeLicense,
      }),
    )
  }
}
