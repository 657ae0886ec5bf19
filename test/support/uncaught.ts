import { afterAll, beforeAll } from 'bun:test'

/**
 * The process's uncaught errors and unhandled rejections while the calling suite runs, kept instead of
 * failing whichever test is running then: each test that provokes one checks this list itself.
 */
export function collectUncaught(): unknown[] {
  const uncaught: unknown[] = []
  const keep = (err: unknown) => uncaught.push(err)
  beforeAll(() => {
    process.on('uncaughtException', keep)
    process.on('unhandledRejection', keep)
  })
  afterAll(() => {
    process.off('uncaughtException', keep)
    process.off('unhandledRejection', keep)
  })
  return uncaught
}
