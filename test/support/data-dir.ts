import { cpSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { openDb, pgliteDir } from '../../src/db/client'

/**
 * DATA_DIRs for the server and CLI processes a test starts. An embedded process's first start creates
 * its PGlite database and applies every migration: about 3 s of CPU, six times a later start's, and
 * dozens of tests start one. Tests that are not about that first start take a copy of a database this
 * test process created and migrated once; the README's own first start (test/examples/clients.test.ts),
 * the embedded server log test and the in-process tests' database still create theirs.
 */
let template: Promise<string> | null = null

async function migratedTemplate(): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'ls-pglite-template-'))
  process.once('exit', () => rmSync(dir, { recursive: true, force: true }))
  const database = await openDb({ databaseUrl: null, dataDir: dir, poolSize: 1 })
  await database.close()
  return pgliteDir(dir)
}

/** A new DATA_DIR; for a process on the embedded database (`embedded`), holding a migrated, empty one. */
export async function newDataDir(prefix: string, { embedded }: { embedded: boolean }): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), prefix))
  if (embedded) cpSync(await (template ??= migratedTemplate()), pgliteDir(dir), { recursive: true })
  return dir
}
