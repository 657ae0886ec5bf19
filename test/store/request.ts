import type { AuthorizeInput } from '../../src/store/store'

/** A request that asks nothing of the store but what `over` adds. */
export const request = (generation: number, nowMs: number, over: Partial<AuthorizeInput> = {}): AuthorizeInput => ({
  nowMs,
  shard: '',
  generation,
  epochs: [],
  ceiling: null,
  buckets: [],
  nonce: null,
  deny: false,
  charge: null,
  ...over,
})
