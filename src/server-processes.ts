import type { Subprocess } from 'bun'
import { log } from './lib/log'
import { withTimeout } from './lib/with-timeout'

/** Set by the first server process on each one it starts: that process's index, 1 to n-1. */
const INDEX_VARIABLE = 'LS_SERVER_PROCESS_INDEX'

/** 0 in the first (or only) server process, the index given at spawn in the others. */
export const serverProcessIndex = (): number => Number(process.env[INDEX_VARIABLE] ?? 0)

/**
 * The settings of Bun's own every launcher of the server sets (the image's ENV, `npm start`), and that
 * the first process gives the others it starts unless the environment already says otherwise. Each is
 * read once, when a process starts, so a process cannot set it for itself.
 *
 * BUN_CONFIG_MAX_HTTP_REQUESTS: the fetches a process may have open, 256 unset, which the webhook
 * deliveries and test pings share out (delivery/fetch-limit.ts): 512 lets the deliveries have their
 * 256 with room for pings beside them.
 *
 * MIMALLOC_PURGE_DELAY: Bun's allocator (mimalloc) gives
 * pages it found empty back to the kernel 10 ms later (madvise), and the next requests' allocations
 * fault them in again: on a virtual machine, where page faults and the TLB flushes behind them cost
 * most, that churn took a fifth of validate throughput (bench: 7,564 against 9,673 validates/s, server
 * CPU 161 against 108 µs each). Never giving them back holds the allocator at its peak, which the
 * request path reaches within seconds and keeps; the caches live on the JavaScript heap, not here.
 */
export const LAUNCH_ENV = { MIMALLOC_PURGE_DELAY: '-1', BUN_CONFIG_MAX_HTTP_REQUESTS: '512' } as const

/** How long a process that exited on its own waits before it is started again. */
const RESTART_DELAY_MS = 1000

/**
 * How long the first process waits for the others to stop on its SIGTERM before it kills them: each
 * takes at most the README's 20 s for its deliveries' results plus 5 s to close its connections.
 */
export const OTHERS_STOP_MS = 25_000

export interface OtherServerProcesses {
  /** Resolves once each one listens; rejects when one exits before. */
  started: Promise<void>
  /** SIGTERM to each, started or still starting, resolved once all have exited (each finishes its own shutdown first); none is started after. */
  stop(): Promise<void>
  /**
   * The indexes of the processes it keeps, running or not: one that exited and is being started again is
   * missing from a scrape, not left out of it.
   */
  indexes(): number[]
  /** Sends a message to one of them over its IPC channel; false when it is not running (never throws). */
  send(index: number, message: unknown): boolean
}

/** What a process the first one started sends it besides 'listening' (a metrics scrape's messages). */
export type FromServerProcess = (index: number, message: unknown) => void

/**
 * Starts server processes 1 to count-1 of this entry point on `port`, beside the first: every one
 * listens with SO_REUSEPORT and the kernel spreads connections across them. `started` resolves once
 * each one listens. They share nothing in memory: every invariant holds across processes the way it
 * holds across instances (PostgreSQL and Redis). One that exits while the server runs is started again.
 */
export function startOtherServerProcesses(count: number, port: number, received: FromServerProcess): OtherServerProcesses {
  let stopping = false
  const running = new Map<number, Subprocess>()
  const spawnOne = (index: number) =>
    new Promise<void>((resolve, reject) => {
      const child = Bun.spawn([process.execPath, Bun.main], {
        env: { ...LAUNCH_ENV, ...process.env, PORT: String(port), [INDEX_VARIABLE]: String(index) },
        stdio: ['ignore', 'inherit', 'inherit'],
        ipc: (message) => {
          if (message === 'listening') resolve()
          else received(index, message)
        },
        onExit: (_proc, code, signal) => {
          running.delete(index)
          // Settles nothing once it listened; before that the whole start-up fails.
          reject(new Error(`server process ${index} exited before listening (code ${code}, signal ${signal})`))
          if (stopping) return
          log.error('server process exited; starting it again', { index, code, signal })
          setTimeout(() => {
            if (!stopping) spawnOne(index).catch(() => {})
          }, RESTART_DELAY_MS)
        },
      })
      running.set(index, child)
    })
  return {
    started: Promise.all(Array.from({ length: count - 1 }, (_, i) => spawnOne(i + 1))).then(() => {}),
    async stop() {
      stopping = true
      const children = [...running.entries()]
      for (const [, child] of children) child.kill('SIGTERM')
      const exited = Promise.all(children.map(([, child]) => child.exited))
      if ((await withTimeout(exited, OTHERS_STOP_MS)) !== null) return
      // Stopped (SIGSTOP) or stuck, a process answers no SIGTERM, and the port still hands it connections.
      for (const [index, child] of children) {
        if (child.exitCode !== null || child.signalCode !== null) continue
        log.error('server process did not stop in time: killed', { index, waitedMs: OTHERS_STOP_MS })
        child.kill('SIGKILL')
      }
      await exited
    },
    indexes: () => Array.from({ length: count - 1 }, (_, i) => i + 1),
    send: (index, message) => sendToChild(running.get(index), message),
  }
}

/**
 * Whether `send` sent: Bun's send() throws ERR_IPC_CHANNEL_CLOSED once the channel closed, which
 * happens before `killed` is set on a child that exits; such a process is as good as missing.
 */
function sent(send: () => unknown): boolean {
  try {
    send()
    return true
  } catch {
    return false
  }
}

/** The first process: sends `message` to a process it started; false when that one is gone or going. */
export const sendToChild = (child: Pick<Subprocess, 'killed' | 'send'> | undefined, message: unknown): boolean =>
  child !== undefined && !child.killed && sent(() => child.send(message))

/** In a process the first one started: sends `message` to the first; false when the channel is gone. */
export const sendToFirstServerProcess = (message: unknown): boolean => process.send !== undefined && sent(() => process.send!(message))

/**
 * In a process the first one started: reports that it listens, and shuts it down when the first
 * process is gone (its IPC channel closes, also when it was killed outright), so none is orphaned
 * on the port.
 */
export function reportToFirstServerProcess(shutdown: () => void, received: (message: unknown) => void): void {
  process.on('disconnect', shutdown)
  process.on('message', received)
  // Gone while this one started: its channel closed before there was a handler to hear it.
  if (!sendToFirstServerProcess('listening')) shutdown()
}
