/**
 * A PostgreSQL connection lost in the middle of a transaction (a failover, a restart, a terminated
 * backend, a reset by the network) fails that transaction and nothing else. postgres.js 3.4.9, the
 * newest release, got this wrong three ways, each fixed by patches/postgres+3.4.9.patch and each
 * failing this test without it:
 * - it wrote its transaction's own ROLLBACK to the closed socket from a setImmediate, and threw there:
 *   an uncaught error, which ends a server process (main.ts);
 * - the dead backend's last error failed the next query its connection ran after reconnecting;
 * - after a reset, that ROLLBACK stayed queued unsent, and the reconnected connection waited for its
 *   answer for ever: every later query on it hung;
 * - it dropped the promise of a new connection's fetch of array types, so a connection lost during
 *   that fetch was an unhandled rejection, which also ends a server process.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { type AddressInfo, connect, createServer, type Server, type Socket } from 'node:net'
import { sql } from 'drizzle-orm'
import postgres from 'postgres'
import { type Database, openDb } from '../../src/db/client'
import { MODE, TEST_DATABASE_URL } from '../support/helpers'
import { collectUncaught } from '../support/uncaught'

/** A connection through the proxy, held at its fetch of array types (postgres.js's first statement). */
interface HeldConnection {
  /** Its backend's process id, from the server's BackendKeyData. */
  backendPid: number
  /** Sends the held statement on. */
  forward(): void
  /** Resets (RST) the client side. */
  reset(): void
}

/** The backend pid in a server-to-client chunk carrying BackendKeyData ('K', length 12, pid, secret), else 0. */
function backendKeyPid(chunk: Buffer): number {
  const at = chunk.indexOf(Buffer.from([0x4b, 0, 0, 0, 12]))
  return at >= 0 && at + 9 <= chunk.length ? chunk.readInt32BE(at + 5) : 0
}

/**
 * A TCP proxy to the test database that can reset (RST) the client side of every connection through
 * it, or hold one new connection at its fetch of array types.
 */
class ResettingProxy {
  readonly #server: Server
  readonly #clients = new Set<Socket>()
  #holdTypesFetch: ((held: HeldConnection) => void) | null = null

  constructor(target: URL) {
    this.#server = createServer((client) => {
      const upstream = connect(Number(target.port || 5432), target.hostname)
      let backendPid = 0
      upstream.on('data', (chunk: Buffer) => {
        backendPid ||= backendKeyPid(chunk)
      })
      upstream.pipe(client)
      client.on('data', (chunk: Buffer) => {
        const hold = this.#holdTypesFetch
        if (!hold || !chunk.includes('pg_catalog.pg_type')) return void upstream.write(chunk)
        this.#holdTypesFetch = null
        hold({ backendPid, forward: () => upstream.write(chunk), reset: () => client.resetAndDestroy() })
      })
      for (const end of [client, upstream]) end.on('error', () => {})
      this.#clients.add(client)
      client.on('close', () => {
        this.#clients.delete(client)
        upstream.destroy()
      })
      // A write to a closed upstream fails it, and a failed source ends no pipe: the server's close
      // must still reach the client.
      upstream.on('close', () => client.end())
    })
  }

  /** The next connection to fetch its array types is handed to `hold` with that statement unsent. */
  holdNextTypesFetch(hold: (held: HeldConnection) => void): void {
    this.#holdTypesFetch = hold
  }

  async listen(): Promise<number> {
    if (!this.#server.listening) await new Promise<void>((resolve) => this.#server.listen(0, '127.0.0.1', resolve))
    return (this.#server.address() as AddressInfo).port
  }

  resetAll(): void {
    for (const client of this.#clients) client.resetAndDestroy()
  }

  close(): void {
    this.#server.close()
  }
}

if (MODE === 'postgres') {
  describe('a connection lost inside a transaction', () => {
    const uncaught = collectUncaught()
    const proxy = new ResettingProxy(new URL(TEST_DATABASE_URL!))
    const killer = postgres(TEST_DATABASE_URL!, { max: 1, onnotice: () => {} })
    afterAll(async () => {
      proxy.close()
      await killer.end()
    })

    /** Three rounds of: a transaction loses its connection mid-statement, then the pool serves transactions and queries. */
    async function loseAndRecover(database: Database, lose: (backendPid: number) => Promise<unknown>) {
      for (let round = 0; round < 3; round++) {
        let pid: number | null = null
        const failed = database.db
          .transaction(async (tx) => {
            const [row] = (await tx.execute(sql`SELECT pg_backend_pid() AS pid`)) as unknown as { pid: number }[]
            pid = row!.pid
            await tx.execute(sql`SELECT pg_sleep(5)`)
          })
          .then(
            () => null,
            (err: unknown) => err,
          )
        while (pid === null) await Bun.sleep(10)
        await lose(pid)
        // The backend's own word (57P01) or the driver's for the closed socket, whichever lands first.
        expect(['57P01', 'CONNECTION_CLOSED']).toContain(((await failed) as { code?: string } | null)?.code ?? 'none')
        // The deferred write ran a turn or two after the failure.
        await Bun.sleep(50)
        expect(uncaught).toEqual([])
        const answers = await Promise.all(
          Array.from({ length: 6 }, (_, i) => database.db.transaction(async (tx) => tx.execute(sql`SELECT ${i}::int AS i`))),
        )
        expect(answers.map((rows) => (rows as unknown as { i: number }[])[0]?.i)).toEqual([0, 1, 2, 3, 4, 5])
        expect(await database.ping()).toBe(true)
      }
    }

    test('by a terminated backend: fails that transaction only, and the pool serves the next ones', async () => {
      const database = await openDb({ databaseUrl: TEST_DATABASE_URL!, dataDir: null, poolSize: 2 })
      try {
        await loseAndRecover(database, (pid) => killer`SELECT pg_terminate_backend(${pid})`)
      } finally {
        await database.close()
      }
    }, 30_000)

    test('by a reset connection: fails that transaction only, and the pool serves the next ones', async () => {
      const url = new URL(TEST_DATABASE_URL!)
      url.port = String(await proxy.listen())
      const database = await openDb({ databaseUrl: url.toString(), dataDir: null, poolSize: 2 })
      try {
        await loseAndRecover(database, async () => proxy.resetAll())
      } finally {
        await database.close()
      }
    }, 30_000)

    // postgres.js 3.4.9 drops the promise of that fetch, so its failure was an unhandled rejection
    // (porsager/postgres#1192, #1223), which ended a server process when PostgreSQL restarted under load.
    describe('lost while a new connection fetches its array types', () => {
      const losses: [string, (held: HeldConnection) => Promise<void>][] = [
        ['by a reset connection', async (held) => held.reset()],
        [
          'by a terminated backend',
          async (held) => {
            await killer`SELECT pg_terminate_backend(${held.backendPid})`
            held.forward()
          },
        ],
      ]
      for (const [how, lose] of losses) {
        test(`${how}: fails or reruns the query waiting for that connection, and the process lives on`, async () => {
          const url = new URL(TEST_DATABASE_URL!)
          url.port = String(await proxy.listen())
          // openDb's migrations run on a connection of their own: the pool's first query opens the one held.
          const database = await openDb({ databaseUrl: url.toString(), dataDir: null, poolSize: 1 })
          try {
            let lost: Promise<void> | null = null
            proxy.holdNextTypesFetch((held) => {
              lost = lose(held)
            })
            const first = await database.db.execute(sql`SELECT 1 AS one`).then(
              () => 'ran',
              (err: unknown) => (err instanceof Error && (err.cause as { code?: string } | undefined)?.code) || String(err),
            )
            expect(lost).not.toBeNull()
            await lost
            // It fails with the lost connection, or postgres.js opens another for it and it runs there;
            // never with the dead backend's 57P01 carried over to the next connection.
            expect(['ran', 'ECONNRESET', 'CONNECTION_CLOSED']).toContain(first)
            // A rejection nobody handles is reported turns later.
            await Bun.sleep(50)
            expect(uncaught).toEqual([])
            expect(await database.ping()).toBe(true)
          } finally {
            await database.close()
          }
        }, 30_000)
      }
    })
  })
}
