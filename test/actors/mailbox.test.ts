import { expect, test } from 'bun:test'
import { Mailbox } from '../../src/actors/mailbox'

/** A promise the test settles by hand. */
function gate() {
  let open!: () => void
  const opened = new Promise<void>((resolve) => (open = resolve))
  return { open, opened }
}

test('tasks run one at a time in the order given, however long each takes', async () => {
  const mailbox = new Mailbox()
  const log: string[] = []
  const task = (name: string, ms: number) => async () => {
    log.push(`start ${name}`)
    await Bun.sleep(ms)
    log.push(`end ${name}`)
    return name
  }
  const results = await Promise.all([mailbox.run(task('a', 30)), mailbox.run(task('b', 1)), mailbox.run(task('c', 10))])
  expect(results).toEqual(['a', 'b', 'c'])
  expect(log).toEqual(['start a', 'end a', 'start b', 'end b', 'start c', 'end c'])
})

test('a failing task rejects only its own caller and the next task still runs', async () => {
  const mailbox = new Mailbox()
  const first = mailbox.run(async () => {
    throw new Error('boom')
  })
  const thrown = mailbox.run(() => {
    throw new Error('sync boom')
  })
  const next = mailbox.run(async () => 'after')
  await expect(first).rejects.toThrow('boom')
  await expect(thrown).rejects.toThrow('sync boom')
  expect(await next).toBe('after')
})

test('a task starts in a later turn, never inside the call that queued it', async () => {
  const mailbox = new Mailbox()
  let started = false
  const done = mailbox.run(async () => {
    started = true
  })
  expect(started).toBe(false)
  await done
  expect(started).toBe(true)
})

test('the mailbox is busy while work is queued and holds nothing once idle', async () => {
  const mailbox = new Mailbox()
  expect(mailbox.idle).toBe(true)
  const held = gate()
  const running = mailbox.run(() => held.opened)
  const queued = mailbox.run(async () => 'second')
  expect(mailbox.idle).toBe(false)
  held.open()
  await running
  expect(await queued).toBe('second')
  await Bun.sleep(0)
  expect(mailbox.idle).toBe(true)
  // An idle mailbox still takes work, and empties again after a failure.
  await expect(mailbox.run(async () => Promise.reject(new Error('x')))).rejects.toThrow('x')
  await Bun.sleep(0)
  expect(mailbox.idle).toBe(true)
})
