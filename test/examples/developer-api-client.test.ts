import { afterAll, expect, expectTypeOf, test } from 'bun:test'
// The package entry, by the package's own name: what a consumer of `license-service/client` imports.
import { developerApi, type DeveloperApi } from 'license-service/client'
import { startExampleServer } from './harness'

const running = await startExampleServer()
afterAll(() => running.server.stop())
const { apiKey, appId } = await running.provision('Typed')
const api: DeveloperApi = developerApi(running.server.url, apiKey)

test('the typed client creates a license and reads it back, typed from the server routes', async () => {
  const created = await api.v1.licenses.post({ appId, quantity: 1, maxHwidSlots: 2, label: 'typed client' })
  expect(created.status).toBe(201)
  if (created.error) throw new Error(`create failed: ${JSON.stringify(created.error.value)}`)
  expectTypeOf(created.data.licenses).toBeArray()
  const [license] = created.data.licenses
  expect(license).toMatchObject({ appId, status: 'active', maxHwidSlots: 2, label: 'typed client' })

  const read = await api.v1.licenses({ licenseKey: license!.licenseKey }).get()
  if (read.error) throw new Error(`read failed: ${JSON.stringify(read.error.value)}`)
  // The response schema's types, not `any`: a route whose schema changed breaks this file's typecheck.
  expectTypeOf(read.data.status).toEqualTypeOf<'active' | 'revoked'>()
  expectTypeOf(read.data.hwidList).toEqualTypeOf<string[]>()
  expectTypeOf(read.data.hwid).toEqualTypeOf<string | null>()
  expect(read.data).toMatchObject({
    licenseKey: license!.licenseKey,
    status: 'active',
    hwidList: [],
    hwid: null,
    label: 'typed client',
  })

  const listed = await api.v1.licenses.get({ query: { appId } })
  if (listed.error) throw new Error(`list failed: ${JSON.stringify(listed.error.value)}`)
  expect(listed.data.licenses.map((l) => l.licenseKey)).toEqual([license!.licenseKey])
})

test('an error comes back as { status, value } in the API error shape, not as data', async () => {
  const missing = await api.v1.licenses({ licenseKey: 'ZZZZ-ZZZZ-ZZZZ-ZZZZ' }).get()
  expect(missing.data).toBeNull()
  // The status is the HTTP status as a number, typed as one of the route's declared error statuses.
  expectTypeOf(missing.error!.status).toEqualTypeOf<400 | 401 | 403 | 404 | 429 | 500 | 422>()
  expect(missing.error?.status).toBe(404)
  expect(missing.error?.value).toEqual({ error: 'not_found', message: expect.any(String) })

  const otherAccount = await running.provision('Other')
  const foreign = await api.v1.licenses.post({ appId: otherAccount.appId })
  expect(foreign.error?.status).toBe(403)
  expect(foreign.error?.value).toMatchObject({ error: 'forbidden' })

  const badKey = await developerApi(running.server.url, 'svc_live_not-a-key').v1.account.get()
  expect(badKey.error?.status).toBe(401)
  expect(badKey.error?.value).toMatchObject({ error: 'invalid_api_key' })
})
