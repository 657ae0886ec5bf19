/**
 * A PostgreSQL connection lost in the middle of a transaction (a failover, a restart, a terminated
 * backend) fails that transaction and nothing else. postgres.js 3.4.9 writes its own ROLLBACK to the
 * dead connection, and that write, deferred to a setImmediate, threw from there: an uncaught error that
 * ends a server process (main.ts exits on one). patches/postgres+3.4.9.patch refuses a transaction's
 * statements once its connection closed and settles a write that finds no socket.
 */
import { describe, expect, test } from 'bun:test'
import { sql } from 'drizzle-orm'
import postgres from 'postgres'
import { openDb } from '../../src/db/client'
import { MODE, TEST_DATABASE_URL } from '../support/helpers'

if (MODE === 'postgres') {
  describe('a connection lost inside a transaction', () => {
    test('fails that transaction only: no uncaught error, and the pool serves the next queries', async () => {
      const uncaught: unknown[] = []
      const keep = (err: unknown) => uncaught.push(err)
      process.on('uncaughtException', keep)
      const database = await openDb({ databaseUrl: TEST_DATABASE_URL!, dataDir: null, poolSize: 2 })
      const killer = postgres(TEST_DATABASE_URL!, { max: 1, onnotice: () => {} })
      try {
        for (let round = 0; round < 3; round++) {
          let pid: number | null = null
          const transaction = database.db.transaction(async (tx) => {
            const [row] = (await tx.execute(sql`SELECT pg_backend_pid() AS pid`)) as unknown as { pid: number }[]
            pid = row!.pid
            await tx.execute(sql`SELECT pg_sleep(5)`)
          })
          const failed = transaction.then(
            () => null,
            (err: unknown) => err,
          )
          while (pid === null) await Bun.sleep(10)
          await killer`SELECT pg_terminate_backend(${pid})`
          // The backend's own word (57P01) or the driver's for the closed socket, whichever lands first.
          expect(['57P01', 'CONNECTION_CLOSED']).toContain(((await failed) as { code?: string } | null)?.code ?? 'none')
          // The deferred write ran a turn or two after the failure.
          await Bun.sleep(50)
          expect(uncaught).toEqual([])
          const answers = await Promise.all(
            Array.from({ length: 6 }, (_, i) => database.db.transaction(async (tx) => tx.execute(sql`SELECT ${i}::int AS i`))),
          )
          expect(answers.map((rows) => (rows as unknown as { i: number }[])[0]?.i)).toEqual([0, 1, 2, 3, 4, 5])
        }
      } finally {
        process.off('uncaughtException', keep)
        await killer.end()
        await database.close()
      }
    }, 30_000)
  })
}
