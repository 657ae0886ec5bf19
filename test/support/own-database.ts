import { randomBytes } from 'node:crypto'
import postgres from 'postgres'
import { TEST_DATABASE_URL } from './helpers'

/**
 * A PostgreSQL database of the test's own, for tests that seal with a key other than the tests' one
 * (the PostgreSQL pass shares one database, whose check value is TEST_MASTER_KEY's). Its URL, and the
 * drop for afterAll.
 */
export async function createOwnDatabase(prefix: string): Promise<{ url: string; drop(): Promise<void> }> {
  if (!TEST_DATABASE_URL) throw new Error('an own PostgreSQL database needs TEST_DATABASE_URL')
  const name = `${prefix}_${process.pid}_${randomBytes(4).toString('hex')}`
  const admin = new URL(TEST_DATABASE_URL)
  admin.pathname = '/postgres'
  const sql = postgres(admin.toString(), { max: 1, onnotice: () => {} })
  await sql.unsafe(`CREATE DATABASE ${name}`)
  const url = new URL(TEST_DATABASE_URL)
  url.pathname = `/${name}`
  return {
    url: url.toString(),
    async drop() {
      await sql.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
      await sql.end()
    },
  }
}
