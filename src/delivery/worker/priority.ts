import { readdirSync, readFileSync } from 'node:fs'
import { setPriority } from 'node:os'

/**
 * Deliveries are background work: this thread and Bun's HTTP client thread (which runs every fetch
 * of the process, and only deliveries fetch in the server) run at the lowest CPU priority, so when
 * the machine is saturated API requests get the CPU first. Linux applies nice per thread; elsewhere,
 * or without permission, this does nothing.
 */
export class LowPriority {
  #self = false
  #http = false

  /** Called after each delivery until both threads are lowered: Bun starts its HTTP client thread with the first fetch. */
  apply(): void {
    if (this.#http) return
    try {
      if (!this.#self) setPriority(0, 19)
      this.#self = true
      for (const tid of readdirSync('/proc/self/task')) {
        if (readFileSync(`/proc/self/task/${tid}/comm`, 'utf8').trim() === 'HTTP Client') {
          setPriority(Number(tid), 19)
          this.#http = true
        }
      }
    } catch {
      // Not Linux, or not allowed: deliveries simply share the CPU evenly.
      this.#http = true
    }
  }
}
