/// <reference lib="webworker" />
import { writeSync } from 'node:fs'
import { BEAT_MS } from './stall-watchdog'

/** The watch stall-watchdog.ts starts: the main thread's counter, and how long it may stay still. */
export interface StallWatch {
  beats: Int32Array
  seconds: number
}

declare var self: Worker

self.onmessage = ({ data: { beats, seconds } }: MessageEvent<StallWatch>) => {
  // The main thread may have run until up to a beat after the last one it made, so the first check that
  // finds the counter still proves nothing: `seconds` are proven by the checks after it.
  const checks = (seconds * 1000) / BEAT_MS + 1
  let last = Atomics.load(beats, 0)
  let still = 0
  // Checks, not the clock: a process stopped (SIGSTOP) and continued finds no time passed between two.
  setInterval(() => {
    const now = Atomics.load(beats, 0)
    still = now === last ? still + 1 : 0
    last = now
    if (still < checks) return
    // Straight to the descriptor: the logger's stream belongs to the main thread.
    const line = {
      level: 'fatal',
      time: new Date().toISOString(),
      msg: 'the main thread has not run for a while: ending the process so that it is restarted',
      seconds: ((still - 1) * BEAT_MS) / 1000,
      pid: process.pid,
    }
    writeSync(2, `${JSON.stringify(line)}\n`)
    process.kill(process.pid, 'SIGKILL')
  }, BEAT_MS)
}
