import Redis from 'ioredis'
import { errorFields, log } from '../../lib/log'

/** A Lua script sent as a named command (EVALSHA, with one EVAL fallback after a Redis restart). */
export interface Script {
  lua: string
  /** Leading arguments that are keys; omitted when the caller passes the count first. */
  numberOfKeys?: number
  /** False for a command that is already one call per round trip: auto-pipelining would hold it for a setImmediate. */
  pipelined?: boolean
}

/** Options for tests: a short connect timeout and no retry storm against a stopped Redis. */
export interface RedisStoreOptions {
  connectTimeoutMs?: number
}

/**
 * The one ioredis connection of a RedisStore, with its scripts as commands, and what every concern of
 * the store shares about it: the store generation and failing fast while the connection is lost.
 */
export class Connection<Commands extends object = object> {
  readonly redis: Redis & Commands
  /** Snapshot.generation: this process's name for the store contents its callers' epochs were read from. */
  #generation = 1
  /** The ls:gen value read under #generation; null until one is read on the current connection. */
  #storeGeneration: string | null = null

  constructor(url: string, options: RedisStoreOptions, scripts: { [name in keyof Commands]: Script }) {
    const named = Object.entries(scripts) as [string, Script][]
    const redis = new Redis(url, {
      lazyConnect: false,
      enableAutoPipelining: true,
      autoPipeliningIgnoredCommands: named.filter(([, s]) => s.pipelined === false).map(([name]) => name),
      connectTimeout: options.connectTimeoutMs ?? 2000,
      // Fail a command fast while Redis is down instead of queueing it for ever; reconnect in the background.
      maxRetriesPerRequest: 1,
      retryStrategy: (times) => Math.min(times * 200, 2000),
    })
    redis.on('error', (err: Error) => log.debug('redis connection error', errorFields(err)))
    // A new connection may reach a server that restarted with older data or a replica that lost writes
    // while keeping ls:gen: whatever was read before it is suspect.
    redis.on('close', () => {
      this.#generation++
      this.#storeGeneration = null
    })
    for (const [name, { lua, numberOfKeys }] of named) redis.defineCommand(name, { lua, numberOfKeys })
    this.redis = redis as Redis & Commands
  }

  get generation(): number {
    return this.#generation
  }

  /** What a call checked against ls:gen sends as the value it expects ('' before the first read). */
  get storeGeneration(): string {
    return this.#storeGeneration ?? ''
  }

  /**
   * The generation a read of ls:gen belongs to. A reply to a call sent before the connection dropped
   * keeps its old generation, which callers no longer accept; a changed value starts a new one.
   */
  observe(seen: string, sentAt: number): number {
    if (sentAt !== this.#generation) return sentAt
    if (this.#storeGeneration !== seen) {
      if (this.#storeGeneration !== null) this.#generation++
      this.#storeGeneration = seen
    }
    return this.#generation
  }

  /** A call sent under `sentAt` found ls:gen at `seen`, not the value expected: a new generation starts. */
  storeChanged(seen: string, sentAt: number): void {
    if (sentAt !== this.#generation) return
    this.#generation++
    this.#storeGeneration = seen
  }

  /**
   * While a lost connection is being re-established, every operation fails at once instead of waiting
   * for a reconnect attempt (seconds each): the hot path fails open or closed, a Developer API request
   * goes unlimited, a cache bump is retried in the background, a credit flush waits for the next pass.
   * Before the first connect, commands queue.
   */
  failFastWhenLost(): void {
    if (this.redis.status === 'reconnecting' || this.redis.status === 'close') {
      throw new Error(`redis connection ${this.redis.status}`)
    }
  }
}
