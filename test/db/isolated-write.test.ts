/**
 * What a batched write does with each kind of failure: a member's own bad data is refused alone, and a
 * database that cannot take writes for now leaves every member unwritten for a retry, never dropped.
 */
import { expect, test } from 'bun:test'
import { sql } from 'drizzle-orm'
import { writeIsolated } from '../../src/db/isolated-write'
import { sharedInfra } from '../support/helpers'

const { database } = await sharedInfra()

test('a server that takes no writes for now (a standby after a failover) is an outage: nothing is refused, everything is kept', async () => {
  const written = await writeIsolated([1, 2, 3], (part) =>
    database.db.transaction(async (tx) => {
      // What a connection that landed on a standby meets: read_only_sql_transaction (25006).
      await tx.execute(sql`SET TRANSACTION READ ONLY`)
      await tx.execute(sql`INSERT INTO cache_invalidations (app_id, app, license_keys) SELECT gen_random_uuid(), true, '{}' FROM unnest(${`{${part.join(',')}}`}::int[])`)
    }),
    'isolate',
  )
  expect(written.refused).toEqual([])
  expect(written.unwritten).toEqual([1, 2, 3])
})

test("a member whose value PostgreSQL refuses is refused alone; the others are written", async () => {
  const written = await writeIsolated([1, 0, 2], (part) =>
    database.db.transaction(async (tx) => {
      await tx.execute(sql`SELECT 1 / n FROM unnest(${`{${part.join(',')}}`}::int[]) AS n`)
    }),
    'isolate',
  )
  expect(written.refused.map((r) => [r.member, r.failure])).toEqual([[0, 'data']])
  expect(written.unwritten).toEqual([])
})

/** A write that meets lock_timeout (55P03) whenever its part holds 0: a row another session holds. */
const lockedAt0 = async (part: readonly number[]) => {
  if (part.includes(0)) throw Object.assign(new Error('canceling statement due to lock timeout'), { code: '55P03' })
}

test('a lock not granted in time, where each member has rows of its own: the member whose row is locked fails alone', async () => {
  const written = await writeIsolated([1, 0, 2], lockedAt0, 'isolate')
  expect(written.refused.map((r) => [r.member, r.failure])).toEqual([[0, 'contention']])
  expect(written.unwritten).toEqual([])
})

test("a lock not granted in time on a table every member writes: an outage, every member kept for a retry", async () => {
  const written = await writeIsolated([1, 0, 2], lockedAt0, 'outage')
  expect(written.refused).toEqual([])
  expect(written.unwritten).toEqual([1, 0, 2])
})
