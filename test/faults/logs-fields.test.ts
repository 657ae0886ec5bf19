/**
 * errorFields keeps what names a database failure (class, SQLSTATE, constraint, table) and drops
 * what carries data: the statement, its parameters, the row in `detail`, quoted values in messages.
 */
import { describe, expect, setSystemTime, test } from 'bun:test'
import { createHash } from 'node:crypto'
import { DrizzleQueryError } from 'drizzle-orm'
import postgres from 'postgres'
import { generateLicenseKey } from '../../src/lib/crypto'
import { licenses } from '../../src/db/schema'
import { RedisStore } from '../../src/store/redis'
import { errorFields, log, logErrorOnce, logEvery, MAX_LOG_LINE, SAME_ERROR_GATHER_MS, setLogDestination, setLogLevel } from '../../src/lib/log'
import { insertLicense } from '../support/client'
import { makeTestApp } from '../support/helpers'
import { loggedBy } from '../support/log-capture'

const sha256 = (text: string) => createHash('sha256').update(text).digest('hex')

/** The lines `fn` logs. */
function captured(fn: () => void): string[] {
  const written: string[] = []
  setLogDestination({ write: (line: string) => written.push(line) })
  try {
    fn()
  } finally {
    setLogDestination()
  }
  return written
}

/** What one log line with these error fields would print. */
function logged(err: unknown): string {
  const written = captured(() => log.error('failed', errorFields(err)))
  expect(written).toHaveLength(1)
  return written[0] ?? ''
}

test('a Redis that cannot be reached is named in the log at warn with why, once every 10 s', async () => {
  setLogLevel('warn')
  // A minute on: a line of the same message another file logged just before would hold this one back.
  setSystemTime(new Date(Date.now() + 60_000))
  try {
    const entries = await loggedBy(async () => {
      const store = new RedisStore('redis://127.0.0.1:1', { connectTimeoutMs: 200 })
      await Bun.sleep(1_000)
      await store.close()
    })
    const lines = entries.filter((entry) => entry.msg === 'redis connection error')
    expect(lines).toHaveLength(1)
    expect(lines[0]).toMatchObject({ level: 'warn', code: 'ECONNREFUSED' })
  } finally {
    setSystemTime()
    setLogLevel('error')
  }
})

describe('errorFields', () => {
  test("a thrown object that is no Error (PGlite's file system on a full disk) keeps its name and codes, nothing else", () => {
    const fields = JSON.parse(logged({ name: 'ErrnoError', errno: 51, code: 'ENOSPC', path: '/data/pglite/base/1/2619', node: { contents: 'x' } }))
    expect(fields).toMatchObject({ error: 'ErrnoError', errno: 51, code: 'ENOSPC' })
    expect(JSON.stringify(fields)).not.toContain('/data')
    expect(JSON.parse(logged({ name: 'not a name!', errno: 'x' }))).toMatchObject({ error: 'object' })
  })

  test('a real unique violation through Drizzle: names the constraint, not the key', async () => {
    const { ctx, seed } = await makeTestApp()
    const { appId } = await seed()
    const key = await insertLicense(ctx, appId)
    const hwid = `hw-${sha256(key).slice(0, 12)}`
    let caught: unknown
    try {
      await ctx.database.db.insert(licenses).values({ key, appId, hwids: [hwid], label: sha256(key) })
    } catch (err) {
      caught = err
    }
    expect(caught).toBeInstanceOf(DrizzleQueryError)
    const line = logged(caught)
    for (const secret of [key, hwid, sha256(key)]) expect(line).not.toContain(secret)
    const fields = JSON.parse(line)
    expect(fields).toMatchObject({
      error: 'DrizzleQueryError',
      message: 'Failed query',
      cause: { code: '23505', table: 'licenses', constraint: 'licenses_pkey' },
    })
    expect(fields.cause.message).toContain('duplicate key value violates unique constraint')
  })

  test('a postgres.js error: no detail, where, query or parameters, and quoted values redacted', () => {
    const key = generateLicenseKey()
    const hash = sha256(key)
    const cause = Object.assign(new postgres.PostgresError({ message: `invalid input syntax for type uuid: "${hash}"` } as never), {
      severity: 'ERROR',
      code: '22P02',
      detail: `Key (key)=(${key}) already exists.`,
      where: `unnamed portal parameter $1 = '${key}'`,
      schema_name: 'public',
      table_name: 'licenses',
      column_name: 'key',
      constraint_name: 'licenses_pkey',
      query: `select * from licenses where key = '${key}'`,
      parameters: [key, hash],
      args: [key],
    })
    const err = new DrizzleQueryError('insert into "licenses" values ($1, $2)', [key, hash], cause)
    const line = logged(err)
    for (const secret of [key, hash]) expect(line).not.toContain(secret)
    expect(JSON.parse(line).cause).toMatchObject({
      error: 'PostgresError',
      code: '22P02',
      message: 'invalid input syntax for type uuid: "…"',
      schema: 'public',
      table: 'licenses',
      column: 'key',
      constraint: 'licenses_pkey',
    })
  })

  test('a poisoned batch of a thousand rows logs one line under the cap', () => {
    const keys = Array.from({ length: 1000 }, () => generateLicenseKey())
    const query = `insert into "licenses" values ${keys.map((_, i) => `($${i + 1})`).join(', ')}`
    const cause = new postgres.PostgresError({ message: 'invalid byte sequence for encoding "UTF8": 0x00' } as never)
    const line = logged(new DrizzleQueryError(query, keys, cause))
    expect(line.length).toBeLessThanOrEqual(MAX_LOG_LINE + 1)
    expect(keys.filter((k) => line.includes(k))).toEqual([])
  })

  test('any oversized field is cut so the line stays under the cap', () => {
    const written = captured(() => {
      log.error('big', { note: 'x'.repeat(100_000), count: 3 })
      log.error('many', Object.fromEntries(Array.from({ length: 200 }, (_, i) => [`f${i}`, 'y'.repeat(400)])))
    })
    expect(written.map((l) => l.length <= MAX_LOG_LINE + 1)).toEqual([true, true])
    expect(JSON.parse(written[0] ?? '')).toMatchObject({ msg: 'big', count: 3 })
    expect(JSON.parse(written[1] ?? '')).toMatchObject({ msg: 'many', truncated: true })
  })

  test('an error shared by the members of a failed batch is logged once', () => {
    const shared = new postgres.PostgresError({ message: 'could not serialize access' } as never)
    const other = new Error('another failure')
    const written = captured(() => {
      for (let i = 0; i < 60; i++) logErrorOnce('unhandled error', shared, { route: '/auth/validate' })
      logErrorOnce('unhandled error', other, { route: '/auth/validate' })
    })
    expect(written.map((line) => JSON.parse(line).message)).toEqual(['could not serialize access', 'another failure'])
  })

  test('the other requests a shared error failed are named on one line after the first', async () => {
    const shared = new Error('pool exhausted')
    const entries = await loggedBy(async () => {
      for (const id of ['req-1', 'req-2', 'req-3']) logErrorOnce('unhandled error', shared, { requestId: id, route: '/auth/validate' })
      await Bun.sleep(SAME_ERROR_GATHER_MS + 100)
    })
    expect(entries).toEqual([
      expect.objectContaining({ msg: 'unhandled error', requestId: 'req-1', message: 'pool exhausted' }),
      expect.objectContaining({ msg: 'unhandled error: the same error failed these requests too', requestIds: ['req-2', 'req-3'], more: 0 }),
    ])
  })

  test('a failure repeated by every retry during an outage logs one line per message', () => {
    let described = 0
    const fields = () => {
      described++
      return { code: 'ECONNREFUSED' }
    }
    setLogLevel('warn')
    let written: string[]
    try {
      written = captured(() => {
        for (let i = 0; i < 500; i++) {
          logEvery('warn', 'credit reconciliation failed; will retry', fields)
          logEvery('error', 'webhook dispatch failed; retrying on the next poll', fields)
          logEvery('debug', 'below the level', fields)
        }
      })
    } finally {
      setLogLevel('error')
    }
    expect(written.map((line) => JSON.parse(line).msg)).toEqual([
      'credit reconciliation failed; will retry',
      'webhook dispatch failed; retrying on the next poll',
    ])
    // A suppressed line costs no description of its error.
    expect(described).toBe(2)
  })
})
