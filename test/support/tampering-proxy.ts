import { afterAll } from 'bun:test'
import { connect, createServer, type Server, type Socket } from 'node:net'
import { RedisStore, type RedisStoreOptions } from '../../src/store/redis'
import { ownRedis } from './servers'

/**
 * A TCP proxy in front of a real server (Redis, PostgreSQL) that can answer for it: the tests of what
 * a compromised or impostor server, or someone on the path of a connection without TLS, can send.
 */
export class TamperingProxy {
  /**
   * While set, every read from the server is answered with this instead, written in pieces of
   * `pieceBytes` a timer apart, so that the client meets it across many reads as well as in one.
   */
  hostile: Buffer | null = null
  pieceBytes = Number.POSITIVE_INFINITY
  /**
   * While set, a new connection does not reach the server: each of its writes (the n-th from 0) is
   * answered with what this returns for it, if anything.
   */
  impostor: ((data: Buffer, n: number) => Buffer | undefined) | null = null
  /**
   * While set, the next write it matches reaches the server, and the server's next answer on that
   * connection is dropped with the connection: a reply lost after the server ran the command.
   */
  loseReplyTo: ((data: Buffer) => boolean) | null = null
  /** While holdWrites is in effect, the writes not yet sent on to the server, in order. */
  #held: (() => void)[] | null = null
  readonly #server: Server
  readonly #sockets = new Set<Socket>()

  constructor(upstreamPort: number) {
    this.#server = createServer((client) => {
      const impostor = this.impostor
      this.#keep(client)
      if (impostor) {
        let writes = 0
        client.on('data', (data: Buffer) => {
          const reply = impostor(data, writes++)
          if (reply) client.write(reply)
        })
        return
      }
      const upstream = connect(upstreamPort, '127.0.0.1')
      this.#keep(upstream)
      client.on('close', () => upstream.destroy())
      upstream.on('close', () => client.destroy())
      let cutOnReply = false
      client.on('data', (data: Buffer) => {
        if (this.loseReplyTo?.(data)) {
          this.loseReplyTo = null
          cutOnReply = true
        }
        if (this.#held) this.#held.push(() => upstream.write(data))
        else upstream.write(data)
      })
      upstream.on('data', (data) => {
        if (cutOnReply) {
          client.destroy()
          upstream.destroy()
        } else if (this.hostile) this.#send(client, this.hostile)
        else client.write(data)
      })
    })
  }

  #keep(socket: Socket): void {
    this.#sockets.add(socket)
    socket.on('error', () => {})
    socket.on('close', () => this.#sockets.delete(socket))
  }

  #send(client: Socket, reply: Buffer): void {
    const next = (at: number) => {
      if (at >= reply.length || client.destroyed) return
      const end = Math.min(reply.length, at + this.pieceBytes)
      client.write(reply.subarray(at, end))
      setTimeout(() => next(end), 1)
    }
    next(0)
  }

  /** Runs `work` with `hostile` set to `reply`, then forwards soundly again whatever `work` did. */
  async replying<T>(reply: string | Buffer, work: () => Promise<T>, pieceBytes = Number.POSITIVE_INFINITY): Promise<T> {
    this.hostile = Buffer.from(reply)
    this.pieceBytes = pieceBytes
    try {
      return await work()
    } finally {
      this.hostile = null
    }
  }

  /** Runs `work` with `impostor` answering every new connection (the open ones are dropped first), then lets them through again. */
  async impersonating<T>(impostor: NonNullable<TamperingProxy['impostor']>, work: () => Promise<T>): Promise<T> {
    this.impostor = impostor
    this.dropAll()
    try {
      return await work()
    } finally {
      this.impostor = null
    }
  }

  /**
   * Holds every connection's writes back from the server, as a server that stopped reading would (the
   * connections stay open), until the function returned is called: it sends them on, in order.
   */
  holdWrites(): () => void {
    this.#held = []
    return () => {
      const held = this.#held ?? []
      this.#held = null
      for (const send of held) send()
    }
  }

  listen(): Promise<number> {
    return new Promise((resolve) => this.#server.listen(0, '127.0.0.1', () => resolve((this.#server.address() as { port: number }).port)))
  }

  /** Ends every connection through the proxy: the clients' next ones meet `impostor` while it is set. */
  dropAll(): void {
    for (const socket of this.#sockets) socket.destroy()
  }

  close(): void {
    this.dropAll()
    this.#server.close()
  }
}

/**
 * A Redis of the test file's own behind a TamperingProxy, a store that reaches it through the proxy
 * (with `options`), and the Redis's own URL; they go after the file's tests.
 */
export async function storeBehindProxy(options: RedisStoreOptions = {}): Promise<{ proxy: TamperingProxy; store: RedisStore; redisUrl: string }> {
  const redis = await ownRedis()
  const proxy = new TamperingProxy(redis.port)
  const store = new RedisStore(`redis://127.0.0.1:${await proxy.listen()}`, options)
  afterAll(async () => {
    await store.close()
    proxy.close()
    await redis.stop()
  })
  return { proxy, store, redisUrl: redis.url }
}
