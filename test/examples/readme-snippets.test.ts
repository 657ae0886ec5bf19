import { expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { REPO_ROOT } from './harness'

// A README code block that opens with `// from <path>` quotes that file: the tests run the file, so the
// quote must stay word for word what they run.
const readme = readFileSync(join(REPO_ROOT, 'README.md'), 'utf8')
const quotes = [...readme.matchAll(/```\w*\n\/\/ from (\S+)\n([\s\S]*?)```/g)].map(([, path, body]) => ({ path: path!, body: body! }))

test('the README quotes the examples it shows', () => {
  expect(quotes.map((q) => q.path).sort()).toEqual(['examples/node/license-check.mjs', 'examples/node/webhook-receiver.mjs'])
})

test.each(quotes.map((q) => [q.path, q.body] as const))('the quote of %s is the file’s code, word for word', (path, body) => {
  expect(readFileSync(join(REPO_ROOT, path), 'utf8')).toContain(body)
})
