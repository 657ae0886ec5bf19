import { randomUUID } from 'node:crypto'
import { TurnBatcher } from '../../lib/batcher'
import { errorFields, log } from '../../lib/log'
import { Deadline } from '../../lib/with-timeout'
import { type AuthorizeInput, type AuthorizeResult, type Authorizer, type Credits, keys, type Shard } from '../store'
import { AUTHORIZE } from './authorize-script'
import type { Connection, Script } from './connection'
import { AuthorizeArgs, authorizeResult } from './wire'

export interface AuthorizeCommands {
  /** [-1, the generation] when it is not the one expected, else [the generation, ...each request's answer]. */
  lsAuthorize(generationKey: string, packed: Buffer, generation: string, fresh: string): Promise<[string, ...number[]] | [-1, string]>
}

export const authorizeScripts: { [name in keyof AuthorizeCommands]: Script } = {
  // Already one call per round trip: auto-pipelining would only hold it for a setImmediate.
  lsAuthorize: { numberOfKeys: 1, lua: AUTHORIZE, pipelined: false },
}

type Reply = Awaited<ReturnType<AuthorizeCommands['lsAuthorize']>>

interface PendingAuthorize {
  input: AuthorizeInput
  resolve(result: AuthorizeResult): void
  reject(err: unknown): void
}

/**
 * The public requests of one shard that arrived while its previous call was in flight, or in the turn
 * of the loop after it came back, go out together as one script call (authorize-script.ts), answered
 * as one array. One call per round trip instead of one per request saves a command, a Lua call and a
 * share of the loopback writes and wake-ups each. A call runs on one shard's slot, so each shard has
 * its own batch and its own call in flight (one of each on a single Redis).
 */
export class RedisAuthorizer implements Authorizer {
  // The first request after a quiet spell goes at once (a microtask); later ones wait for the call in
  // flight to come back (or pass its deadline), and one turn of the loop more. At most one batcher per shard.
  readonly #batchers = new Map<Shard, TurnBatcher<PendingAuthorize>>()
  /** Shards with a call past its deadline and still unanswered: their requests fail at once meanwhile. */
  readonly #overdue = new Set<Shard>()

  constructor(
    private readonly conn: Connection<AuthorizeCommands>,
    private readonly credits: Pick<Credits, 'refund' | 'uncount'>,
  ) {}

  authorize(input: AuthorizeInput): Promise<AuthorizeResult> {
    try {
      this.conn.failFastWhenLost()
    } catch (err) {
      return Promise.reject(err)
    }
    if (input.generation !== this.conn.generation) return Promise.resolve(this.#newGeneration())
    const { shard } = input
    const overdue = this.#overdueError(shard)
    if (overdue) return Promise.reject(overdue)
    let batcher = this.#batchers.get(shard)
    if (!batcher) {
      batcher = new TurnBatcher<PendingAuthorize>((batch) => this.#send(shard, batch), { oneInFlight: true })
      this.#batchers.set(shard, batcher)
    }
    const queue = batcher
    return new Promise((resolve, reject) => queue.add({ input, resolve, reject }))
  }

  #newGeneration(): AuthorizeResult {
    return { kind: 'new_generation', generation: this.conn.generation }
  }

  /**
   * Replies on a connection come in order: behind an overdue call of the shard, none would come sooner;
   * on one Redis, behind any overdue call (Connection.overdue).
   */
  #overdueError(shard: Shard): Error | null {
    if (this.#overdue.size === 0 || !this.#overdue.has(shard)) return this.conn.stalled()
    return new Error(`redis has not answered an authorize call of shard '${shard}' in ${this.conn.callTimeoutMs} ms`)
  }

  /** Sends one call; the promise it returns resolves once its callers are answered: by the reply, or as failed at the deadline. */
  #send(shard: Shard, queued: PendingAuthorize[]): Promise<unknown> | undefined {
    // Those that waited for a call that went overdue.
    const overdue = this.#overdueError(shard)
    if (overdue) {
      for (const p of queued) p.reject(overdue)
      return undefined
    }
    const sentAt = this.conn.generation
    const drops = this.conn.dropsOf(shard)
    let batch = queued
    // The generation moved while some of them waited for the call in flight (rare: no copy otherwise).
    if (!queued.every((p) => p.input.generation === sentAt)) {
      batch = queued.filter((p) => p.input.generation === sentAt)
      for (const p of queued) if (p.input.generation !== sentAt) p.resolve(this.#newGeneration())
      if (batch.length === 0) return undefined
    }
    const call = new AuthorizeArgs(shard, this.conn.shards > 1)
    const sent: PendingAuthorize[] = []
    for (const p of batch) {
      try {
        call.add(p.input)
        sent.push(p)
      } catch (err) {
        p.reject(err)
      }
    }
    if (sent.length === 0) return undefined
    let reply: Promise<Reply>
    try {
      reply = this.conn.redis.lsAuthorize(keys.generation(shard), call.packed(), this.conn.storeGeneration(shard), randomUUID())
    } catch (err) {
      // The batcher drops a batch whose send throws: its callers would wait for ever.
      for (const p of sent) p.reject(err)
      return undefined
    }
    // Past the deadline (Connection.callTimeoutMs) these requests are answered as in an outage, and so
    // is every request of the shard until this call is answered or fails (ioredis sends it again on a
    // new connection, and fails it when the reconnect does).
    let gaveUp = false
    return new Promise<void>((callOver) => {
      const deadline = new Deadline(() => {
        gaveUp = true
        this.#overdue.add(shard)
        this.conn.overdue(reply)
        const err = new Error(`redis did not answer an authorize call within ${this.conn.callTimeoutMs} ms`)
        for (const p of sent) p.reject(err)
        callOver()
      }, this.conn.callTimeoutMs)
      const settled = (replies: Reply | null, err: unknown) => {
        deadline.clear()
        try {
          if (gaveUp) {
            this.#overdue.delete(shard)
            this.#late(sent, replies, drops)
          } else {
            this.#settle(sent, shard, sentAt, drops, replies, err)
          }
        } finally {
          // Whatever happened to its answers, the shard's next call must go.
          callOver()
        }
      }
      reply.then((replies) => settled(replies, null), (err: unknown) => settled(null, err))
    })
  }

  /**
   * A reply that came after its requests were answered as failed: whatever it charged is given back, as
   * for a call answered in a new generation; its nonces stay claimed (the clients retry with new ones).
   */
  #late(batch: PendingAuthorize[], reply: Reply | null, drops: number): void {
    if (reply && reply[0] !== -1) this.#refundAll(batch, reply as number[], drops)
  }

  #settle(
    batch: PendingAuthorize[],
    shard: Shard,
    sentAt: number,
    drops: number,
    reply: Reply | null,
    err: unknown,
  ): void {
    let replies = reply as number[] | null
    if (reply) this.conn.observe(shard, String(reply[0] === -1 ? reply[1] : reply[0]), sentAt)
    if (reply?.[0] === -1) {
      // Nothing ran: the shard's generation is not the one these requests' epochs were read under.
      replies = null
    } else if (replies && sentAt !== this.conn.generation) {
      // A new generation began while the call was out: an earlier reply showed the shard's generation
      // key changed, or a cluster node's connection dropped. Its verdicts cannot be trusted, and its
      // charges are given back, unless the shard's master changed since (a failover, or a slot moved):
      // RedisCredits.refund drops those, as the data now there may never have held them.
      err = new Error('redis connection was replaced during the call')
      this.#refundAll(batch, replies, drops)
      replies = null
    }
    // Each request's answer follows the generation.
    let at = 1
    for (const p of batch) {
      if (!replies) {
        if (err) p.reject(err)
        else p.resolve(this.#newGeneration())
        continue
      }
      try {
        const [result, next] = authorizeResult(replies, at, drops)
        at = next
        p.resolve(result)
      } catch (e) {
        p.reject(e)
      }
    }
  }

  /**
   * Gives back what a call charged for requests that were answered as failed (a late reply, a replaced
   * connection), and uncounts their heartbeats: a counted call the client must repeat would otherwise
   * make the repeat of a charged tenth call free.
   */
  #refundAll(batch: PendingAuthorize[], replies: number[], drops: number): void {
    let at = 1
    try {
      for (const p of batch) {
        const [result, next] = authorizeResult(replies, at, drops)
        at = next
        const charge = p.input.charge
        if (result.kind !== 'ok' || !charge) continue
        if (result.charged > 0) {
          this.credits.refund(charge.accountId, result.charged, result.chargedUnder).catch((e: unknown) =>
            log.warn('refund of a call answered as failed did not reach redis', errorFields(e)),
          )
        }
        if (charge.counter) {
          this.credits.uncount(charge.counter.key, result.chargedUnder).catch((e: unknown) =>
            log.warn('the heartbeat count of a call answered as failed was not given back', errorFields(e)),
          )
        }
      }
    } catch (err) {
      // Thrown before its callers are answered, it would leave them waiting for ever.
      log.error('unreadable authorize reply: the charges of a call answered as failed were not given back', errorFields(err))
    }
  }
}
