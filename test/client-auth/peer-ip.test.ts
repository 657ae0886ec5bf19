import { expect, test } from 'bun:test'
import { makeTestApp } from '../support/helpers'
import { hwid, insertLicense, nonce } from '../support/client'

// The in-process tests have no socket peer; here the client IP comes from the listening server.
test('over a socket the TCP peer is the client IP the lists see, whatever X-Forwarded-For says', async () => {
  const t = await makeTestApp()
  const s = await t.seed()
  const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
  t.app.listen({ hostname: '127.0.0.1', port: 0 })
  try {
    const url = `http://127.0.0.1:${t.app.server?.port}/auth/validate`
    const validate = async (headers: Record<string, string> = {}) => {
      const res = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body: JSON.stringify({ appId: s.appId, appSecret: s.appSecret, licenseKey: key, hwid: hwid(), nonce: nonce() }),
      })
      return { status: res.status, body: await res.json() }
    }
    expect((await validate()).status).toBe(200)
    const listed = await t.req('PUT', `/v1/apps/${s.appId}/security`, { apiKey: s.apiKey, body: { ipBlacklist: ['127.0.0.1'] } })
    expect(listed.status).toBe(200)
    // No trusted proxies by default: a forwarded address is ignored, the peer is blocked.
    expect(await validate({ 'x-forwarded-for': '198.51.100.7' })).toEqual({ status: 403, body: { status: 'failed', error: 'blocked' } })
    expect((await validate()).status).toBe(403)
  } finally {
    await t.app.stop(true)
  }
})
