import { expect, test } from 'bun:test'
import { Deadline, withDeadline, withTimeout } from '../../src/lib/with-timeout'

/** Holds the event loop for `ms`, as a long collection or a host that paused the process does. */
const stall = (ms: number) => {
  const until = performance.now() + ms
  while (performance.now() < until) {}
}

/** An answer from another process, that arrives while this one is stalled: it waits in a pipe's buffer. */
const answerFromElsewhere = () => new Response(Bun.spawn(['sh', '-c', 'sleep 0.1; echo answered']).stdout).text()

test('an answer that came while the event loop stalled past the deadline is taken, not the deadline', async () => {
  const answer = answerFromElsewhere()
  const timed = withTimeout(answer, 300)
  stall(1000)
  expect(await timed).toBe('answered\n')
  const deadline = withDeadline(answerFromElsewhere(), 300, 'the answer')
  stall(1000)
  expect(await deadline).toBe('answered\n')
})

test('with no answer the deadline passes, and a cleared one never does', async () => {
  expect(await withTimeout(new Promise(() => {}), 20)).toBeNull()
  await expect(withDeadline(new Promise(() => {}), 20, 'the answer')).rejects.toThrow('the answer did not finish within 20 ms')
  let expired = 0
  const cleared = new Deadline(() => expired++, 10)
  new Deadline(() => expired++, 10)
  cleared.clear()
  await Bun.sleep(50)
  expect(expired).toBe(1)
})
