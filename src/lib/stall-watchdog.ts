/**
 * Ends the process when its main thread stops running JavaScript: a loop that never returns (embedded
 * PGlite was seen spinning for good inside its WebAssembly when its WAL could not grow on a full disk)
 * leaves a process that holds its port and answers nothing, not even /healthz, and logs nothing, and a
 * supervisor that restarts what exits (compose's `restart: unless-stopped`, the first server process
 * for the others) never learns of it. A worker thread, which the main thread's loop does not hold,
 * watches a counter the main thread bumps every second; once its own checks prove `seconds` with no
 * bump it writes one line to stderr and kills the process (SIGKILL: a SIGTERM would wait for the main
 * thread's handler, which is what no longer runs).
 */
import type { StallWatch } from './stall-watchdog-worker'

/** How often the main thread shows it runs, and the worker looks. */
export const BEAT_MS = 1000

/** Starts the watch (`seconds` 0: none). The counter and worker live as long as the process. */
export function startStallWatchdog(seconds: number): void {
  if (seconds === 0) return
  const beats = new Int32Array(new SharedArrayBuffer(4))
  setInterval(() => Atomics.add(beats, 0, 1), BEAT_MS).unref()
  const worker = new Worker(new URL('./stall-watchdog-worker.ts', import.meta.url).href)
  worker.postMessage({ beats, seconds } satisfies StallWatch)
  worker.unref()
}
