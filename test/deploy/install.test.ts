/**
 * `npm install`'s dependency install scripts. npm 12 skips every one that package.json's `allowScripts`
 * does not approve, and Bun's is what puts the Bun binary in place: unapproved, `npm install && npm
 * start` would install a stub that only prints an error. Each dependency with an install script
 * (package-lock.json records which) must be named there, approved or denied, so none is decided by the
 * version of npm a user happens to run.
 */
import { describe, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'

const ROOT = join(import.meta.dir, '..', '..')
const manifest = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
  allowScripts?: Record<string, boolean>
  scarfSettings?: { enabled?: boolean }
}
const lock = JSON.parse(readFileSync(join(ROOT, 'package-lock.json'), 'utf8')) as {
  packages: Record<string, { hasInstallScript?: boolean }>
}

/** The package name of a lockfile path: `node_modules/a/node_modules/@b/c` is `@b/c`. */
const packageName = (path: string) => path.slice(path.lastIndexOf('node_modules/') + 'node_modules/'.length)

describe('install scripts', () => {
  test('every dependency with an install script is approved or denied in allowScripts', () => {
    const withScripts = Object.entries(lock.packages)
      .filter(([path, entry]) => path !== '' && entry.hasInstallScript)
      .map(([path]) => packageName(path))
    expect(withScripts).toContain('bun')
    const unreviewed = [...new Set(withScripts)].filter((name) => typeof manifest.allowScripts?.[name] !== 'boolean')
    expect(unreviewed).toEqual([])
  })

  test("Bun's own install script is approved: it puts the binary that npm start and npm test run in place", () => {
    expect(manifest.allowScripts?.bun).toBe(true)
  })

  // An npm older than 11 (node:22's npm 10, which the image's build runs) reads no allowScripts and runs
  // the script: Scarf's own opt-out in the root package.json is what keeps it from reporting then.
  test("swagger-ui-dist's analytics ping (@scarf/scarf) is denied, and turned off for an npm that runs it anyway", () => {
    expect(manifest.allowScripts?.['@scarf/scarf']).toBe(false)
    expect(manifest.scarfSettings?.enabled).toBe(false)
  })
})
