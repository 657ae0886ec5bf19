import { afterAll, describe, expect, test } from 'bun:test'
import { and, eq, inArray } from 'drizzle-orm'
import { type DomainEvent, recordEvents } from '../../src/delivery/outbox'
import { ValidatedEventBatch, type ValidatedEventBatchOptions } from '../../src/delivery/validated-events'
import { events } from '../../src/db/schema'
import { type Database, openDb } from '../../src/db/client'
import { makeTestApp, MODE, TEST_DATABASE_URL } from '../support/helpers'
import { loggedBy } from '../support/log-capture'
import { hwid } from '../support/client'
import { connectionRefused } from '../support/pg-errors'
import { until } from '../support/servers'
import { postgresBehindProxy } from '../support/tampering-proxy'

const t = await makeTestApp()
const batchSink = (ctx: typeof t.ctx) => ({ database: ctx.database, bus: ctx.bus, dropped: ctx.metrics.validatedEventsDropped })
const db = t.ctx.database.db

const validated = (appId: string, h = hwid()): DomainEvent => ({
  event: 'license.validated',
  data: { licenseKey: `K-${h.slice(0, 12)}`, appId, status: 'active', hwid: h },
  occurredAt: new Date(),
})

async function hwidsRecorded(appIds: string[]): Promise<string[]> {
  const rows = await db
    .select({ data: events.data })
    .from(events)
    .where(and(inArray(events.appId, appIds), eq(events.event, 'license.validated')))
    // Written order: without ORDER BY a later chunk's rows came back first once (CI, the shared database).
    .orderBy(events.id)
  return rows.map((r) => String(r.data.hwid))
}

test('an event PostgreSQL refuses is dropped alone: the events of two other accounts in its batch are recorded', async () => {
  const [a, b] = [await t.seed({ name: 'Account A' }), await t.seed({ name: 'Account B' })]
  const batch = new ValidatedEventBatch(batchSink(t.ctx))
  const good = [validated(a.appId), validated(b.appId), validated(a.appId), validated(b.appId)]
  batch.add(good[0]!)
  batch.add(good[1]!)
  batch.add(validated(a.appId, 'a\u0000b'))
  batch.add(validated(b.appId, 'x\ud800'))
  batch.add(good[2]!)
  batch.add(good[3]!)
  await batch.flush()

  expect((await hwidsRecorded([a.appId, b.appId])).sort()).toEqual(good.map((e) => String(e.data.hwid)).sort())
  expect(batch.kept).toBe(0)
})

test('events that meet an unreachable database are kept and written, in order, once it answers', async () => {
  const s = await t.seed()
  let refusals = 3
  const batch = new ValidatedEventBatch(batchSink(t.ctx), {
    write: async (list) => {
      if (refusals-- > 0) throw connectionRefused()
      await recordEvents(db, list)
    },
  })
  const sent = Array.from({ length: 20 }, () => validated(s.appId))
  for (const e of sent.slice(0, 10)) batch.add(e)
  await batch.flush()
  expect(batch.kept).toBe(10)
  for (const e of sent.slice(10)) batch.add(e)

  const recorded = await until(() => hwidsRecorded([s.appId]), (got) => got.length >= sent.length)
  expect(recorded).toEqual(sent.map((e) => String(e.data.hwid)))
  expect(batch.kept).toBe(0)
})

test('beyond the bound the oldest kept events are dropped, with one error line and a metric', async () => {
  const s = await t.seed()
  let down = true
  const batch = new ValidatedEventBatch(batchSink(t.ctx), {
    maxKept: 50,
    write: async (list) => {
      if (down) throw connectionRefused()
      await recordEvents(db, list)
    },
  })
  const metric = async () => {
    const text = (await t.req('GET', '/metrics')).body as string
    return Number(/^license_validated_events_dropped_total\{reason="overflow"\} (\d+)$/m.exec(text)?.[1] ?? 0)
  }
  const droppedBefore = await metric()
  const sent = Array.from({ length: 80 }, () => validated(s.appId))
  const logged = await loggedBy(async () => {
    for (const [i, e] of sent.entries()) {
      batch.add(e)
      if (i % 20 === 19) await batch.flush()
    }
  })
  expect(batch.kept).toBe(50)
  expect(await metric()).toBe(droppedBefore + 30)
  const errors = logged.filter((entry) => entry.level === 'error')
  expect(errors).toHaveLength(1)
  expect(errors[0]?.msg).toContain('license.validated')

  down = false
  const recorded = await until(() => hwidsRecorded([s.appId]), (got) => got.length >= 50)
  expect(recorded).toEqual(sent.slice(30).map((e) => String(e.data.hwid)))
})

if (MODE === 'postgres') {
  describe('a write whose answer is lost with its connection', async () => {
    const { proxy, url } = await postgresBehindProxy(TEST_DATABASE_URL!)
    const database = await openDb({ databaseUrl: url, dataDir: null, poolSize: 1 })
    afterAll(async () => {
      await database.close()
      proxy.close()
    })
    const proxiedSink = () => ({ ...batchSink(t.ctx), database })

    // Until every kept event is written, and the write under way with them has finished.
    const settled = (batch: ValidatedEventBatch) =>
      until(
        async () => {
          await batch.flush()
          return batch.kept
        },
        (kept) => kept === 0,
      )

    const hwids = (list: DomainEvent[]) => list.map((e) => String(e.data.hwid))

    /**
     * A batch whose write of `first` is cut off with its COMMIT on its way: the COMMIT is held back and
     * the client's connection fails, while the server's stays open, its transaction with it (its rows
     * inserted, not committed), until `release`, which ends it without the COMMIT.
     */
    async function cutWhileOpen(first: DomainEvent[], options: ValidatedEventBatchOptions = {}, through: Database = database) {
      const batch = new ValidatedEventBatch({ ...proxiedSink(), database: through }, options)
      let release = () => {}
      let cut = false
      let inserted = false
      proxy.loseReplyTo = (data) => {
        if (data.includes(hwids(first)[0]!)) inserted = true
        else if (inserted) {
          proxy.loseReplyTo = null
          // Held before it is sent on: the COMMIT never reaches the server.
          release = proxy.holdWrites('open')
          queueMicrotask(() => {
            proxy.closeForgottenClients()
            cut = true
          })
        }
        return false
      }
      for (const e of first) batch.add(e)
      await batch.flush()
      expect(cut).toBe(true)
      return { batch, release: () => release() }
    }

    test('while its transaction is still open on the server, later events are written, and its own once it is known to have failed', async () => {
      const s = await t.seed()
      const first = Array.from({ length: 5 }, () => validated(s.appId))
      const later = Array.from({ length: 3 }, () => validated(s.appId))
      const { batch, release } = await cutWhileOpen(first)
      try {
        expect(batch.kept).toBe(5)
        for (const e of later) batch.add(e)
        await batch.flush()
        expect(await hwidsRecorded([s.appId])).toEqual(hwids(later))
        expect(batch.kept).toBe(5)
      } finally {
        release()
      }
      expect(await settled(batch)).toBe(0)
      expect((await hwidsRecorded([s.appId])).sort()).toEqual(hwids([...later, ...first]).sort())
    })

    test("the events of writes whose outcome is unknown count against the bound: past it such a write is the first to go", async () => {
      const s = await t.seed()
      const first = Array.from({ length: 5 }, () => validated(s.appId))
      const later = Array.from({ length: 3 }, () => validated(s.appId))
      const { batch, release } = await cutWhileOpen(first, { maxKept: 6 })
      try {
        for (const e of later) batch.add(e)
        // The batch's own wait trims, then writes what is left.
        expect(await until(async () => (await hwidsRecorded([s.appId])).length, (n) => n === 3)).toBe(3)
        expect(batch.kept).toBe(0)
      } finally {
        release()
      }
      await batch.flush()
      expect(await hwidsRecorded([s.appId])).toEqual(hwids(later))
    })

    test('an id PostgreSQL gave out again (after a crash, a failover) to a transaction that committed does not pass for the lost write: its events are written', async () => {
      const s = await t.seed()
      const first = Array.from({ length: 5 }, () => validated(s.appId))
      // Every question about a transaction's fate answers as for the one that took the write's id since.
      const reused: Database = {
        ...database,
        aside: (questions) => database.aside((ask) => questions(async (text, params) => (text.includes('pg_xact_status') ? [{ status: 'committed' }] : ask(text, params)))),
      }
      const { batch, release } = await cutWhileOpen(first, {}, reused)
      release()
      expect(await settled(batch)).toBe(0)
      expect((await hwidsRecorded([s.appId])).sort()).toEqual(hwids(first).sort())
    })

    test('a write whose COMMIT finishes between the questions (its rows not there yet, its id committed) is recorded once, not written again', async () => {
      const s = await t.seed()
      let first = true
      // The first look for the rows comes before the COMMIT finished.
      const late: Database = {
        ...database,
        aside: (questions) =>
          database.aside((ask) =>
            questions(async (text, params) => {
              if (text.includes('EXISTS') && first) {
                first = false
                return [{ found: false }]
              }
              return ask(text, params)
            }),
          ),
      }
      const batch = new ValidatedEventBatch({ ...proxiedSink(), database: late })
      const sent = Array.from({ length: 5 }, () => validated(s.appId))
      proxy.loseReplyTo = commitAfter(String(sent[0]!.data.hwid))
      for (const e of sent) batch.add(e)
      await batch.flush()
      expect(batch.kept).toBe(5)
      expect(await settled(batch)).toBe(0)
      expect(await hwidsRecorded([s.appId])).toEqual(sent.map((e) => String(e.data.hwid)))
    })

    // What the client sends after the INSERT naming `marker` is its COMMIT (by name once prepared).
    const commitAfter = (marker: string) => {
      let inserted = false
      return (data: Buffer) => {
        if (data.includes(marker)) inserted = true
        else if (inserted) return true
        return false
      }
    }
    test.each([
      ['its COMMIT reached PostgreSQL: its events are recorded once, not written again', commitAfter, 5],
      ['it was cut before its COMMIT: its events are written again, once the transaction is known to have failed', (marker: string) => (data: Buffer) => data.includes(marker), 0],
    ])('%s', async (_name, lose, committed) => {
      const s = await t.seed()
      const batch = new ValidatedEventBatch(proxiedSink())
      const sent = Array.from({ length: 5 }, () => validated(s.appId))
      proxy.loseReplyTo = lose(String(sent[0]!.data.hwid))
      for (const e of sent) batch.add(e)
      await batch.flush()
      expect(proxy.loseReplyTo).toBeNull()
      expect(batch.kept).toBe(5)
      expect(await until(() => hwidsRecorded([s.appId]), (got) => got.length === committed)).toHaveLength(committed)
      expect(await settled(batch)).toBe(0)
      expect(await hwidsRecorded([s.appId])).toEqual(sent.map((e) => String(e.data.hwid)))
    })
  })
}
