/**
 * A PostgreSQL connection whose packets are dropped without a reset (a black-holed network, a NAT or
 * load balancer that forgot the flow) used to hold its query, and whatever waited on it (a request, an
 * app's mailbox, the webhook dispatcher and its stop), until the kernel gave up on the socket: about
 * 15 minutes, as postgres.js has no timeout of its own. Its backend, idle inside the transaction,
 * kept that transaction's locks for as long, and every other instance's request for those rows waited
 * behind them. Now a query unanswered for the stall time is checked on from a connection of its own:
 * a backend running no statement is ended and the connection fails its queries; one running a long
 * statement is left alone.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { sql } from 'drizzle-orm'
import postgres from 'postgres'
import { openDb } from '../../src/db/client'
import { errorCode } from '../../src/db/errors'
import { backendCheck } from '../../src/db/stall-check'
import { rowsOf } from '../../src/delivery/prepared'
import { MODE, TEST_DATABASE_URL } from '../support/helpers'
import { until } from '../support/servers'
import { postgresBehindProxy } from '../support/tampering-proxy'

const STALL_SECONDS = 1
// The advisory lock the stalled transaction holds, which another connection then waits for.
const LOCK = 7_771_001

if (MODE === 'postgres') {
  describe('A PostgreSQL connection that goes unanswered', async () => {
    const { proxy, url } = await postgresBehindProxy(TEST_DATABASE_URL!)
    // One connection, so every query meets the one that is black-holed.
    const database = await openDb({ databaseUrl: url, dataDir: null, poolSize: 1, stallSeconds: STALL_SECONDS })
    const direct = postgres(TEST_DATABASE_URL!, { max: 1, onnotice: () => {} })
    afterAll(async () => {
      await database.close()
      await direct.end({ timeout: 1 })
      proxy.close()
    })

    const failure = (work: Promise<unknown>) => work.then(() => null, (err: unknown) => err)
    const serves = async () => expect(rowsOf(await database.db.execute(sql`SELECT 1 AS one`))[0]).toEqual({ one: 1 })
    // After an outage the pool's first connect may still be on its way out (its connect timeout).
    const servesAgain = async () => {
      const answered = await until(() => failure(database.db.execute(sql`SELECT 1`)), (err) => err === null, 10_000)
      expect(answered).toBeNull()
    }

    test('a transaction whose connection is black-holed fails within seconds, and its backend lets go of its locks', async () => {
      let pid = 0
      let startedAt = 0
      let stalled: unknown = null
      const transaction = failure(
        database.db.transaction(async (tx) => {
          const [row] = rowsOf(await tx.execute(sql`SELECT pg_backend_pid() AS pid, pg_advisory_xact_lock(${LOCK})`))
          pid = Number(row!.pid)
          proxy.holdWrites('open')
          startedAt = Date.now()
          stalled = await failure(tx.execute(sql`SELECT 1`))
          throw stalled
        }),
      )
      // The transaction itself fails with its ROLLBACK's error: the connection is gone by then.
      expect(await transaction).not.toBeNull()
      expect(errorCode(stalled)).toBe('CONNECTION_STALLED')
      // The stall time and one check, up to twice the stall time with the watch's granularity.
      expect(performance.now() - startedAt).toBeLessThan(STALL_SECONDS * 2_000 + 2_000)
      // The backend was ended: another connection gets the lock at once, not in two hours.
      const backends = async () => (await direct`SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = ${pid}`)[0]!.n
      expect(await until(backends, (n) => n === 0, 5_000)).toBe(0)
      const [taken] = await direct`SELECT pg_try_advisory_lock(${LOCK}) AS taken`
      expect(taken!.taken).toBe(true)
      await direct`SELECT pg_advisory_unlock(${LOCK})`
      // The pool opens a new connection, which the network still carries.
      await serves()
    })

    test('with the server unreachable, the query fails once the check goes unanswered, and the pool serves again after', async () => {
      await serves()
      const release = proxy.holdWrites('all')
      const started = performance.now()
      try {
        expect(errorCode(await failure(database.db.execute(sql`SELECT 1`)))).toBe('CONNECTION_STALLED')
        // The stall time, up to twice it, then the check's 5 s.
        expect(performance.now() - started).toBeLessThan(STALL_SECONDS * 2_000 + 7_000)
      } finally {
        release()
      }
      await servesAgain()
    }, 30_000)

    test('the check ends a backend only once it has been idle for the stall time, and only while its connection still waits', async () => {
      const check = backendCheck(postgres, TEST_DATABASE_URL!, { onnotice: () => {} }, STALL_SECONDS)
      const other = postgres(TEST_DATABASE_URL!, { max: 1, onnotice: () => {} })
      try {
        const [{ pid }] = (await other`SELECT pg_backend_pid() AS pid`) as unknown as [{ pid: number }]
        const alive = async () => (await direct`SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = ${pid}`)[0]!.n === 1
        // Just finished: its answer may still be on the way (a lock wait that ended as the check began).
        expect(await check({ pid }, () => true)).toBe(true)
        await Bun.sleep(STALL_SECONDS * 1_000 + 200)
        // An answer read meanwhile: the connection is not waiting any more.
        expect(await check({ pid }, () => false)).toBe(true)
        expect(await alive()).toBe(true)
        // Idle for the stall time, its connection still waiting: ended.
        expect(await check({ pid }, () => true)).toBe(false)
        expect(await until(alive, (up) => !up, 5_000)).toBe(false)
      } finally {
        await other.end({ timeout: 1 })
      }
    })

    test('a statement that runs past the stall time, or waits for a lock that long, is left to finish', async () => {
      expect(rowsOf(await database.db.execute(sql`SELECT pg_sleep(${STALL_SECONDS * 2.5})::text AS slept`))[0]).toEqual({ slept: '' })
      await direct`SELECT pg_advisory_lock(${LOCK})`
      const waiting = database.db.execute(sql`SELECT pg_advisory_xact_lock(${LOCK})`)
      await Bun.sleep(STALL_SECONDS * 2_500)
      await direct`SELECT pg_advisory_unlock(${LOCK})`
      expect(rowsOf(await waiting)).toHaveLength(1)
    })
  })
}
