import { readFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { createApp } from './app'
import { buildContext } from './boot'
import { type Config, ConfigError, loadConfig } from './config'
import type { Context } from './context'
import { describeHolder, isLock, LOCK_WAIT_MS, lockDataDir, mayLetGo } from './db/data-dir-lock'
import { startOperatorSocket, usesOperatorSocket } from './operator/socket'
import { errorFields, log, logLibraryOutput, setLogLevel } from './lib/log'
import { withTimeout } from './lib/with-timeout'
import { LOW_FD_LIMIT, maxFds, startEventLoopMonitor } from './lib/process-metrics'
import { internalMetricsApp } from './http/ops'
import { type ProcessRole, ServerMetrics } from './http/scrape'
import {
  type OtherServerProcesses,
  reportToFirstServerProcess,
  sendToFirstServerProcess,
  serverProcessIndex,
  startOtherServerProcesses,
} from './server-processes'
import { startDispatcher } from './delivery/dispatcher'
import { watchKeyCheck } from './signing/key-check'
import { startStallWatchdog } from './lib/stall-watchdog'
import { startEmbeddedUpkeep } from './db/embedded-upkeep'

/**
 * How long a stopping server waits for its requests in flight before it closes their connections: a
 * body still on its way holds its request up to its deadline (app.ts), and what the stop does after
 * (the last credit flush, the events still batched) must fit a supervisor's grace period.
 */
const HTTP_DRAIN_MS = 5_000
/** How long a start stopped by a signal waits for storage to open and close, within compose's 30 s grace. */
const STARTING_STOP_MS = 20_000

/** The settings, or exit 2 naming the one that is wrong. */
function settings(): Readonly<Config> {
  try {
    return loadConfig()
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err
    process.stderr.write(`configuration error: ${err.message}\n`)
    process.exit(2)
  }
}

/**
 * Everything that runs beside the requests; stop() ends it in order, before storage closes.
 * stopDeliveries() ends the dispatcher's claims alone, earlier: at the start of a shutdown, while the
 * requests in flight drain. Claimed meanwhile, each delivery to a receiver that hangs would hold the
 * stop 10 s more; the events left are delivered by the next start (or another instance).
 */
function startBackgroundWork(ctx: Context): { stopDeliveries(): Promise<void>; stop(): Promise<void> } {
  // Delivers events committed before a restart as well as new ones; one claim per delivery across instances.
  const dispatcher = startDispatcher(ctx)
  // Moves credit charges from the store into PostgreSQL.
  const reconciler = ctx.credits.startReconciler()
  // Bumps the cache invalidations that the instance making a change could not (any instance's, alive or gone).
  const sweeper = ctx.actors.invalidator.startSweeper()
  ctx.signer.start({ worker: ctx.config.serverProcesses === 1 })
  // Licenses up to most of CACHE_MAX_MB, so first requests do not each read PostgreSQL.
  const warmUp = ctx.config.cacheWarmUp ? ctx.actors.startWarmUp() : null
  // What autovacuum and the checkpointer do on a PostgreSQL server, which embedded PGlite has neither of.
  const upkeep = ctx.database.kind === 'pglite' ? startEmbeddedUpkeep(ctx.database.db) : null
  let deliveriesStopped: Promise<void> | null = null
  const stopDeliveries = () => (deliveriesStopped ??= dispatcher.stop())
  return {
    stopDeliveries,
    async stop() {
      await warmUp?.stop()
      // Side by side, each bounded on its own: with the database gone, each waits out its bound, and
      // one after the other they passed a supervisor's grace period. The events still batched are
      // written, the charges moved and the deliveries recorded while the database is open.
      const stopped = await Promise.allSettled([ctx.validatedEvents.stop(), reconciler.stop(), sweeper.stop(), stopDeliveries(), upkeep?.stop()])
      await ctx.webhookPool.close()
      const failed = stopped.find((s) => s.status === 'rejected')
      if (failed) throw failed.reason
    },
  }
}

/**
 * Why the server could not listen on HOST and PORT (an error code), or null, asked before anything
 * opens: found at the listen, after the migrations, it was a stack trace naming neither setting. And the
 * server's processes share the port with SO_REUSEPORT, which the kernel grants any listener of the same
 * user that asks for it too: a second server started on the same port (`npm start` twice, an upgrade
 * beside the old one) would take part of the traffic, with another database's keys, without an error.
 * Bound without it, a probe finds any listener there (EADDRINUSE).
 */
function listenProblem(host: string, port: number): Promise<string | null> {
  return new Promise((resolve) => {
    const probe = createServer()
    probe.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? 'failed'))
    probe.listen({ host, port }, () => probe.close(() => resolve(null)))
  })
}

/**
 * Takes this server's claim on HOST and PORT for the life of its first process, or EADDRINUSE when
 * another server holds it: two servers started at the same moment both pass the probe, which runs
 * seconds before their listen (the database opens in between), and both would then listen with
 * SO_REUSEPORT. A Linux abstract socket is bound atomically, names no file, and the kernel frees it
 * when the process dies; elsewhere the probe alone decides.
 */
function claimPort(host: string, port: number): Promise<string | null> {
  // Port 0 is a port of the kernel's choosing, which no other server is given.
  if (process.platform !== 'linux' || port === 0) return Promise.resolve(null)
  return new Promise((resolve) => {
    const claim = createServer()
    // Only a claim held says anything: any other failure leaves the decision to the probe.
    claim.once('error', (err: NodeJS.ErrnoException) => resolve(err.code === 'EADDRINUSE' ? err.code : null))
    claim.listen(`\0license-service:${host}:${port}`, () => {
      claim.unref()
      resolve(null)
    })
  })
}

async function main(): Promise<void> {
  const config = settings()
  setLogLevel(config.logLevel)
  const first = serverProcessIndex() === 0
  // Checked by the first process before anything opens; the others join its listener.
  const problem = first ? ((await claimPort(config.host, config.port)) ?? (await listenProblem(config.host, config.port))) : null
  if (problem === 'EADDRINUSE') {
    process.stderr.write(`error: port ${config.port} on ${config.host} is in use: one server per port (its own processes share it)\n`)
    process.exit(1)
  }
  if (problem !== null) {
    process.stderr.write(`configuration error: HOST=${config.host} PORT=${config.port} cannot be listened on (${problem})\n`)
    process.exit(2)
  }
  // The metrics listener opens after the database too: a problem found there was a stack trace.
  const metricsProblem = first && config.metricsPort !== null ? await listenProblem(config.metricsHost, config.metricsPort) : null
  if (metricsProblem !== null) {
    const where = `METRICS_HOST=${config.metricsHost} METRICS_PORT=${config.metricsPort}`
    process.stderr.write(metricsProblem === 'EADDRINUSE' ? `error: ${where} is in use\n` : `configuration error: ${where} cannot be listened on (${metricsProblem})\n`)
    process.exit(metricsProblem === 'EADDRINUSE' ? 1 : 2)
  }
  const fdLimit = first ? maxFds() : null
  if (fdLimit !== null && fdLimit < LOW_FD_LIMIT) {
    log.warn('the open-files limit is low: past about that many connections a core spins on refused accepts and new connections wait; raise it (ulimit -n, compose ulimits)', { limit: fdLimit, wanted: LOW_FD_LIMIT })
  }
  if (usesOperatorSocket(config)) {
    // Another server of this namespace never lets go.
    const lock = await lockDataDir(config.dataDir, 'server', LOCK_WAIT_MS, mayLetGo)
    if (!isLock(lock)) {
      process.stderr.write(`error: ${describeHolder(config.dataDir, lock)}${lock.owner === 'server' ? '; one server per DATA_DIR' : ''}\n`)
      process.exit(1)
    }
  }
  const contextReady = buildContext(config)
  // Listening before the database is open: a CLI started meanwhile waits for this server instead of
  // opening the embedded database a second time.
  const operatorSocket = usesOperatorSocket(config) ? startOperatorSocket(config, contextReady) : null
  // A signal while storage opens (a first embedded start runs initdb for seconds) stops the start:
  // storage is closed once open (within a bound), the socket goes and the lock with the exit, so a
  // backup's `test ! -e data/lock` and the next start find nothing left behind.
  let startStopped = false
  const stopStarting = (signal: string) => {
    if (startStopped) return
    startStopped = true
    log.info('shutting down while starting', { reason: signal })
    const closed = contextReady.then(async (opened) => {
      await opened.store.close()
      await opened.database.close()
    })
    void withTimeout(Promise.allSettled([operatorSocket?.stop(), closed]), STARTING_STOP_MS).finally(() => process.exit(0))
  }
  const onStartSignal = { SIGINT: () => stopStarting('SIGINT'), SIGTERM: () => stopStarting('SIGTERM') }
  for (const [signal, handler] of Object.entries(onStartSignal)) process.on(signal, handler)
  // A start that fails answers the commands waiting on the socket (they did not run) and removes it.
  const ctx = await contextReady.catch(async (err: unknown) => {
    await operatorSocket?.stop()
    throw err
  })
  if (startStopped) return
  const index = serverProcessIndex()
  const role: ProcessRole =
    config.serverProcesses === 1
      ? { kind: 'single' }
      : index === 0
        ? { kind: 'first' }
        : { kind: 'other', index, toFirst: sendToFirstServerProcess }
  const scrape = new ServerMetrics(ctx, role)
  const app = createApp(ctx, scrape)
  startEventLoopMonitor()
  // From here on: the start itself may hold the thread for seconds (an embedded database's initdb).
  startStallWatchdog(config.stallExitSeconds)
  const background = startBackgroundWork(ctx)
  const tls =
    config.tlsCertFile && config.tlsKeyFile
      ? { cert: readFileSync(config.tlsCertFile, 'utf8'), key: readFileSync(config.tlsKeyFile, 'utf8') }
      : undefined
  app.listen({
    hostname: config.host,
    port: config.port,
    tls,
    reusePort: config.serverProcesses > 1,
    // No ceiling of Bun's own: its refusal is an empty 413 or a dropped connection. app.ts reads every
    // body with a bound (declared lengths refused unread, streamed ones cut at the limit) and answers JSON.
    maxRequestBodySize: Number.MAX_SAFE_INTEGER,
  })
  const port = app.server?.port ?? config.port
  // The first process alone: it gathers the others' series, so one scrape there describes the server.
  const metricsListener =
    config.metricsPort !== null && index === 0
      ? internalMetricsApp(scrape).listen({ hostname: config.metricsHost, port: config.metricsPort })
      : null

  let others: OtherServerProcesses | null = null
  let stopping = false
  const shutdown = async (reason: string, exitCode = 0) => {
    if (stopping) return
    stopping = true
    log.info('shutting down', { reason, process: index })
    // The other processes stop beside this one's own parts, not before them: each may wait seconds for
    // its requests, deliveries and last credit flush, and one after the other they could outlast a
    // supervisor's grace period (compose's 30 s), whose SIGKILL loses what was still being recorded.
    const own = async () => {
      await operatorSocket?.stop()
      await metricsListener?.stop()
      // Begun now, awaited beside the other last writes in background.stop(), which reports its failure.
      background.stopDeliveries().catch(() => {})
      if ((await withTimeout(app.stop(), HTTP_DRAIN_MS)) === null) await app.stop(true)
      await background.stop()
      await ctx.store.close()
      await ctx.database.close()
    }
    keyWatch?.stop()
    for (const stopped of await Promise.allSettled([others?.stop(), own()])) {
      if (stopped.status === 'rejected') log.error('error during shutdown', errorFields(stopped.reason))
    }
    process.exit(exitCode)
  }
  process.on('SIGINT', () => void shutdown('SIGINT'))
  process.on('SIGTERM', () => void shutdown('SIGTERM'))
  // Only now, in the same turn: a signal without a listener gets Bun's default action, which kills (the
  // lock, the socket and the embedded database left as by kill -9) for the ~80 ms the app took to start.
  for (const [signal, handler] of Object.entries(onStartSignal)) process.off(signal, handler)
  // Instances share PostgreSQL: a master-key rotation can commit while this one runs (the rotation
  // refuses while it sees a server connected, and it may have seen none). Exit 2, as a start with
  // the old key would: a supervisor that restarts it shows why it does not start.
  const keyWatch =
    ctx.database.kind === 'postgres' ? watchKeyCheck(ctx.database, ctx.sealer, () => void shutdown('the master key was rotated', 2)) : null

  if (index > 0) {
    reportToFirstServerProcess(
      () => void shutdown('the first server process is gone'),
      (message) => scrape.receive(message),
    )
    return
  }
  // The others start once this one has a port (PORT=0 picks one) and has run the migrations. A shutdown
  // that began meanwhile starts none, and one that begins while they start stops them too: else they
  // would outlive this process on the port (one still starting has not yet watched for its going).
  if (config.serverProcesses > 1 && !stopping) {
    const starting = startOtherServerProcesses(config.serverProcesses, port, (from, message) => scrape.receive(message, from))
    others = starting
    try {
      await starting.started
    } catch (err) {
      // Stopped by the shutdown under way, which exits.
      if (stopping) return
      throw err
    }
    scrape.attach(starting)
  }
  log.info('listening', {
    url: `${tls ? 'https' : 'http'}://${config.host}:${port}`,
    metrics: metricsListener ? `http://${config.metricsHost}:${metricsListener.server?.port}/metrics` : '/metrics on the same port',
    database: ctx.database.kind,
    store: ctx.store.kind,
    processes: config.serverProcesses,
  })
}

logLibraryOutput()

// Bun's own report of an uncaught error prints every property of the error object, and drivers
// attach the statement, its parameters and the row: report it through errorFields, then exit as Bun would.
for (const event of ['uncaughtException', 'unhandledRejection'] as const) {
  process.on(event, (err: unknown) => {
    log.error(event, errorFields(err))
    process.exit(1)
  })
}

main().catch((err) => {
  // A wrong or missing key found once the database is open is a setting too: one line, exit 2.
  if (err instanceof ConfigError) {
    process.stderr.write(`configuration error: ${err.message}\n`)
    process.exit(2)
  }
  log.error('failed to start', errorFields(err))
  process.exit(1)
})
