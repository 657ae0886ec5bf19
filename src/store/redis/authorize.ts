import { randomUUID } from 'node:crypto'
import { TurnBatcher } from '../../lib/batcher'
import { errorFields, log } from '../../lib/log'
import type { AuthorizeInput, AuthorizeResult, Authorizer, Credits } from '../store'
import { AUTHORIZE } from './authorize-script'
import type { Connection, Script } from './connection'
import { AuthorizeArgs, authorizeResult } from './wire'

export interface AuthorizeCommands {
  lsAuthorize(packed: Buffer, generation: string, fresh: string): Promise<number[] | [-1, string]>
}

export const authorizeScripts: { [name in keyof AuthorizeCommands]: Script } = {
  // Already one call per round trip: auto-pipelining would only hold it for a setImmediate.
  lsAuthorize: { numberOfKeys: 0, lua: AUTHORIZE, pipelined: false },
}

interface PendingAuthorize {
  input: AuthorizeInput
  resolve(result: AuthorizeResult): void
  reject(err: unknown): void
}

/**
 * The public requests that arrived while the previous call was in flight go out together as one
 * script call (authorize-script.ts), answered as one array. One call per round trip instead of one per
 * request saves a command, a Lua call and a share of the loopback writes and wake-ups each; under load
 * a call carries 10 to 20.
 */
export class RedisAuthorizer implements Authorizer {
  // The first request after a quiet spell goes at once (a microtask); later ones wait for the call in
  // flight to come back.
  readonly #batcher = new TurnBatcher<PendingAuthorize>((batch) => this.#send(batch), { oneInFlight: true })

  constructor(
    private readonly conn: Connection<AuthorizeCommands>,
    private readonly credits: Pick<Credits, 'refund'>,
  ) {}

  authorize(input: AuthorizeInput): Promise<AuthorizeResult> {
    try {
      this.conn.failFastWhenLost()
    } catch (err) {
      return Promise.reject(err)
    }
    if (input.generation !== this.conn.generation) return Promise.resolve(this.#newGeneration())
    return new Promise((resolve, reject) => this.#batcher.add({ input, resolve, reject }))
  }

  #newGeneration(): AuthorizeResult {
    return { kind: 'new_generation', generation: this.conn.generation }
  }

  /** Sends one call; the promise it returns settles when the reply is in, before the callers are answered. */
  #send(queued: PendingAuthorize[]): Promise<unknown> | undefined {
    const sentAt = this.conn.generation
    let batch = queued
    // The generation moved while some of them waited for the call in flight (rare: no copy otherwise).
    if (!queued.every((p) => p.input.generation === sentAt)) {
      batch = queued.filter((p) => p.input.generation === sentAt)
      for (const p of queued) if (p.input.generation !== sentAt) p.resolve(this.#newGeneration())
      if (batch.length === 0) return undefined
    }
    const call = new AuthorizeArgs()
    for (const p of batch) call.add(p.input)
    const reply = this.conn.redis.lsAuthorize(call.packed(), this.conn.storeGeneration, randomUUID())
    // Registered before the batcher's own callback on the same promise, so the batcher sends what
    // queued meanwhile right after this runs and before the callers' continuations: Redis works on the
    // next batch while this one's requests go on.
    reply.then(
      (replies) => this.#settle(batch, sentAt, replies, null),
      (err: unknown) => this.#settle(batch, sentAt, null, err),
    )
    return reply
  }

  #settle(batch: PendingAuthorize[], sentAt: number, reply: number[] | [-1, string] | null, err: unknown): void {
    let replies = reply as number[] | null
    if (reply?.[0] === -1) {
      // Nothing ran: the store's generation is not the one these requests' epochs were read under.
      this.conn.storeChanged(String(reply[1]), sentAt)
      replies = null
    } else if (replies && sentAt !== this.conn.generation) {
      // ioredis re-sent the call on a new connection, where ls:gen may have survived a loss of
      // later writes (a failover): its verdicts cannot be trusted, and its charges are given back.
      err = new Error('redis connection was replaced during the call')
      this.#refundAll(batch, replies)
      replies = null
    }
    let at = 0
    for (const p of batch) {
      if (!replies) {
        if (err) p.reject(err)
        else p.resolve(this.#newGeneration())
        continue
      }
      try {
        const [result, next] = authorizeResult(replies, at)
        at = next
        p.resolve(result)
      } catch (e) {
        p.reject(e)
      }
    }
  }

  #refundAll(batch: PendingAuthorize[], replies: number[]): void {
    let at = 0
    for (const p of batch) {
      const [result, next] = authorizeResult(replies, at)
      at = next
      const accountId = p.input.charge?.accountId
      if (result.kind === 'ok' && result.charged > 0 && accountId) {
        this.credits.refund(accountId, result.charged).catch((e: unknown) =>
          log.warn('refund after a replaced redis connection failed', errorFields(e)),
        )
      }
    }
  }
}
