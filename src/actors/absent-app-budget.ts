import { BoundedMap } from './bounded'

/**
 * A made-up app id costs PostgreSQL reads before anything can refuse it: there is no app yet whose
 * limits apply. So each IP may find absent apps `perMinute` times a minute (a token bucket charged
 * only by a lookup that found no app: real clients, and lookups cut short by a store or database
 * outage, never spend it); past that its uncached app ids are answered invalid_app without a read.
 * Kept per process on purpose: no store round trip on a cold path, and n processes bound the
 * database's load to n times this. Concurrent lookups of one IP may overdraw it by their number.
 */
export class AbsentAppBudget {
  readonly #buckets: BoundedMap<{ tokens: number; at: number }>

  constructor(
    private readonly perMinute: number,
    ips: number,
  ) {
    this.#buckets = new BoundedMap(ips)
  }

  #tokens(ip: string, nowMs: number): number {
    const bucket = this.#buckets.get(ip)
    if (!bucket) return this.perMinute
    return Math.min(this.perMinute, bucket.tokens + (Math.max(0, nowMs - bucket.at) * this.perMinute) / 60_000)
  }

  allows(ip: string, nowMs: number): boolean {
    return this.#tokens(ip, nowMs) >= 1
  }

  /** A lookup by `ip` found no app. */
  charge(ip: string, nowMs: number): void {
    this.#buckets.set(ip, { tokens: Math.max(0, this.#tokens(ip, nowMs) - 1), at: nowMs })
  }
}
