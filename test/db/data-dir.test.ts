/**
 * DATA_DIR is this user's alone: the embedded database's files under it (license keys in the clear,
 * HWIDs, hashes of API keys) are written readable by every local user.
 */
import { afterAll, expect, test } from 'bun:test'
import { chmodSync, mkdtempSync, rmSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { makeDataDir } from '../../src/db/data-dir'
import { MODE, TEST_MASTER_KEY } from '../support/helpers'
import { runToExit } from '../support/server-process'

const root = mkdtempSync(join(tmpdir(), 'ls-data-dir-'))
afterAll(() => rmSync(root, { recursive: true, force: true }))
const modeOf = (path: string) => statSync(path).mode & 0o777

test('a new DATA_DIR, and the directories it needs above it, are 0700', () => {
  const dir = join(root, 'new', 'data')
  makeDataDir(dir)
  expect(modeOf(dir)).toBe(0o700)
  expect(modeOf(join(root, 'new'))).toBe(0o700)
})

test('an existing DATA_DIR that other users may enter is made 0700', () => {
  const dir = join(root, 'open')
  makeDataDir(dir)
  chmodSync(dir, 0o755)
  makeDataDir(dir)
  expect(modeOf(dir)).toBe(0o700)
})

// An embedded database in either pass: run once.
test.skipIf(MODE !== 'embedded')('provisioning an embedded server leaves its database where only its user can reach it', async () => {
  const dir = join(root, 'embedded')
  const env = { DATA_DIR: dir, DATABASE_URL: '', REDIS_URL: '', MASTER_KEY: TEST_MASTER_KEY.toString('hex') }
  const run = await runToExit(['src/operator/cli.ts', 'account', 'create', '--name', 'Private'], env)
  expect(run.code, run.stderr).toBe(0)
  expect(modeOf(dir)).toBe(0o700)
}, 60_000)
