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
  /** While set, a new connection is closed at once, as by a server that is gone; those open go on. */
  refuseNew = false
  /** While holdWrites is in effect, the writes not yet sent on to the server, in order. */
  #held: (() => void)[] = []
  /** The client connections whose writes are held; while #holdingNew, each new one joins them. */
  readonly #heldClients = new Set<Socket>()
  /** Held client connections the server's side cannot reach either: its replies and its close are dropped. */
  readonly #forgotten = new Set<Socket>()
  /** The server's side of forgotten connections their client closed: it learns of it on release. */
  readonly #orphaned = new Set<Socket>()
  #holdingNew = false
  readonly #clients = new Set<Socket>()
  readonly #server: Server
  readonly #sockets = new Set<Socket>()

  constructor(upstreamPort: number) {
    this.#server = createServer((client) => {
      const impostor = this.impostor
      this.#keep(client)
      if (this.refuseNew) {
        client.destroy()
        return
      }
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
      this.#clients.add(client)
      if (this.#holdingNew) this.#heldClients.add(client)
      client.on('close', () => {
        this.#clients.delete(client)
        this.#heldClients.delete(client)
        if (this.#forgotten.delete(client)) this.#orphaned.add(upstream)
        else upstream.destroy()
      })
      upstream.on('close', () => this.#forgotten.has(client) || client.destroy())
      let cutOnReply = false
      client.on('data', (data: Buffer) => {
        if (this.loseReplyTo?.(data)) {
          this.loseReplyTo = null
          cutOnReply = true
        }
        if (this.#heldClients.has(client)) this.#held.push(() => upstream.write(data))
        else upstream.write(data)
      })
      upstream.on('data', (data) => {
        if (this.#forgotten.has(client)) return
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
   * Holds connections' writes back from the server, as a server that stopped reading would (the
   * connections stay open), until the function returned is called: it sends them on, in order. Of
   * `all` connections, or only of those `open` now, as a network path that forgot them would (a NAT,
   * a load balancer): nothing reaches either side then, not even a close, while new connections
   * reach the server.
   */
  holdWrites(of: 'all' | 'open' = 'all'): () => void {
    for (const client of this.#clients) {
      this.#heldClients.add(client)
      if (of === 'open') this.#forgotten.add(client)
    }
    this.#holdingNew = of === 'all'
    return () => {
      const held = this.#held
      this.#held = []
      this.#heldClients.clear()
      this.#forgotten.clear()
      for (const upstream of this.#orphaned) upstream.destroy()
      this.#orphaned.clear()
      this.#holdingNew = false
      for (const send of held) send()
    }
  }

  /**
   * Closes the client side of the connections holdWrites('open') forgot: their clients see them fail,
   * while the server's side stays open, as after a NAT forgot the flow, until the holdWrites release.
   */
  closeForgottenClients(): void {
    for (const client of this.#forgotten) client.destroy()
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

/** A PostgreSQL server's URL through a TamperingProxy of its own (the caller closes it). */
export async function postgresBehindProxy(serverUrl: string): Promise<{ proxy: TamperingProxy; url: string }> {
  const target = new URL(serverUrl)
  const proxy = new TamperingProxy(Number(target.port || 5432))
  const url = new URL(target)
  url.port = String(await proxy.listen())
  return { proxy, url: url.toString() }
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
