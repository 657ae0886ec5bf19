import type postgres from 'postgres'
import { log } from '../lib/log'
import { withDeadline } from '../lib/with-timeout'
import { SQLSTATE, errorCode } from './errors'

/**
 * Seconds a query of a pool waits with nothing read before its connection is checked on. The
 * service's statements take milliseconds; one that waits longer is a lock wait or a large delete,
 * which the check finds running and lets be.
 */
export const STALL_SECONDS = 10
/** How long the check may take: a server that does not answer it is taken for unreachable. */
const CHECK_MS = 5_000
/** pg_stat_activity's states of a backend running a statement (a lock wait is `active` too). */
const RUNNING = new Set(['active', 'fastpath function call'])

export type StallCheck = NonNullable<postgres.Options<{}>['stall_check']>

/**
 * The patched driver's `stall_check` (patches/postgres+3.4.9.patch): whether the backend `pid` is
 * still running a statement, asked on a connection of its own to the same server (`url`, its host
 * and port as the stalled connection's). A backend that is not, of a connection still waiting
 * (`stalled`), is terminated, so that it lets go of the locks of the transaction its client is giving
 * up on (a backend idle in a transaction otherwise keeps them until the server's own keepalive, two
 * hours). A server that does not answer at all is taken for gone: the connection's queries fail now,
 * as they would in 15 minutes, and the pool opens a new one.
 */
export function backendCheck(connect: typeof postgres, url: string, options: postgres.Options<{}>, stallSeconds: number): StallCheck {
  return async ({ pid, host, port }, stalled) => {
    const server = host === undefined || port === undefined ? {} : { host, port }
    const probe = connect(url, { ...options, ...server, max: 1, connect_timeout: CHECK_MS / 1000 })
    try {
      return await withDeadline(isRunning(probe, pid, stalled, stallSeconds), CHECK_MS, 'The check on an unanswered PostgreSQL connection')
    } catch (err) {
      const code = errorCode(err)
      // PostgreSQL answered with an error of its own (too many connections, shutting down): it is
      // there, so the connection may still be answered; the next check asks again.
      if (code !== undefined && SQLSTATE.test(code)) return true
      log.warn('PostgreSQL did not answer the check on a connection that went unanswered: the connection is closed', { code })
      return false
    } finally {
      void probe.end({ timeout: 0 })
    }
  }
}

async function isRunning(probe: postgres.Sql, pid: number | null, stalled: () => boolean, stallSeconds: number): Promise<boolean> {
  const result = await probe<{ own: number; state: string | null; idle_s: number | null }[]>`
    SELECT pg_backend_pid() AS own, a.state, extract(epoch FROM now() - a.state_change)::float8 AS idle_s
    FROM (SELECT 1) AS one LEFT JOIN pg_stat_activity AS a ON a.pid = ${pid}`
  // Behind a pooler the pid a connection is told is the pooler's, not its backend's: nothing to look
  // up, so the connection is left to the kernel's timeout.
  if (pid === null || result.state.pid !== result[0]!.own) return true
  const { state, idle_s: idleSeconds } = result[0]!
  if (state !== null && RUNNING.has(state)) return true
  // A backend that finished within the stall time (a lock wait that ended just now) may have an answer
  // on its way, and so may a connection that read one meanwhile (its event loop held up): the next
  // check asks again. One that went on unanswered is ended then.
  if ((idleSeconds !== null && idleSeconds < stallSeconds) || !stalled()) return true
  if (state !== null) await probe`SELECT pg_terminate_backend(${pid})`
  log.warn('A PostgreSQL connection went unanswered while its backend ran no statement: the connection is closed', {
    backendState: state ?? 'gone',
  })
  return false
}
