import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createConfig, lintFromString } from '@redocly/openapi-core'
import { listeningApp } from './docs-server'

// The document as a client reads it: over HTTP from a listening server, not from app.handle.
let server: Awaited<ReturnType<typeof listeningApp>>

beforeAll(async () => {
  server = await listeningApp()
})
afterAll(() => server.stop())

test('/docs/json is OpenAPI 3.1 with no error under Redocly\'s recommended rules', async () => {
  const res = await fetch(`${server.origin}/docs/json`)
  expect(res.status).toBe(200)
  const source = await res.text()
  expect(JSON.parse(source).openapi).toBe('3.1.0')

  const config = await createConfig({ extends: ['recommended'] })
  const problems = await lintFromString({ source, absoluteRef: `${server.origin}/docs/json`, config })
  const shown = (severity: string) =>
    problems
      .filter((p) => p.severity === severity)
      .map((p) => `${p.ruleId} at ${p.location[0]?.pointer}: ${p.message}`)
  expect(shown('error')).toEqual([])
  // Known and accepted: no `license` in info (the service is not published under one) and no 4XX
  // response on /healthz, /readyz and /metrics (they have none). Anything else is new.
  expect(new Set(problems.filter((p) => p.severity === 'warn').map((p) => p.ruleId))).toEqual(
    new Set(['info-license', 'operation-4xx-response']),
  )
})
