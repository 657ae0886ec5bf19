import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { chromium } from 'playwright-core'
import { listeningApp } from './docs-server'

const CHROMIUM = '/usr/bin/chromium'
const ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
]

let server: Awaited<ReturnType<typeof listeningApp>>

beforeAll(async () => {
  server = await listeningApp()
})
afterAll(() => server.stop())

// Chromium is a system package, not an npm one: where it is missing the suite says so and goes on, so
// `npm install && npm test` still passes on a fresh machine. This machine and CI have it.
const hasChromium = existsSync(CHROMIUM)
if (!hasChromium) console.warn(`SKIPPED: ${CHROMIUM} is missing; apt-get install chromium to run the Swagger UI test`)

describe.skipIf(!hasChromium)('Swagger UI offline', () => {
  test('Swagger UI renders every operation of the document in headless Chromium, with nothing fetched from elsewhere', async () => {
    const doc = await (await fetch(`${server.origin}/docs/json`)).json()
    const operations = Object.values<Record<string, unknown>>(doc.paths).reduce((n, item) => n + Object.keys(item).length, 0)

    const profile = mkdtempSync(join(tmpdir(), 'ls-chromium-'))
    const browser = await chromium.launchPersistentContext(profile, { executablePath: CHROMIUM, headless: true, args: ARGS })
    const elsewhere: string[] = []
    try {
      // Offline as a browser with no internet would be: only the local server answers.
      await browser.route('**/*', (route) => {
        const url = route.request().url()
        if (url.startsWith(`${server.origin}/`)) return route.continue()
        elsewhere.push(url)
        return route.abort()
      })
      const page = await browser.newPage()
      // Under the suite's own timeout, so a page that never renders fails with Playwright's reason.
      page.setDefaultTimeout(20_000)
      const pageErrors: string[] = []
      page.on('pageerror', (err) => pageErrors.push(err.message))
      await page.goto(`${server.origin}/docs`)
      await page.locator('.opblock').nth(operations - 1).waitFor()

      expect(await page.locator('.opblock').count()).toBe(operations)
      expect(await page.locator('.info .title').innerText()).toContain(doc.info.title)
      expect(await page.locator('.version-stamp').innerText()).toContain('3.1')
      // Swagger UI lists what it could not resolve or parse in an errors box.
      expect(await page.locator('.errors-wrapper').count()).toBe(0)
      expect(pageErrors).toEqual([])
      expect(elsewhere).toEqual([])
    } finally {
      await browser.close()
      rmSync(profile, { recursive: true, force: true })
    }
  })
})
