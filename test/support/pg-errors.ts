/** What the postgres driver throws when PostgreSQL is down: a failed connect, wrapped by drizzle. */
export function connectionRefused(): Error {
  const refused = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED', syscall: 'connect' })
  return new Error('Failed query', { cause: refused })
}
