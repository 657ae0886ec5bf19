import { expect, test } from 'bun:test'
import { makeTestApp } from '../support/helpers'
import { hwid, insertLicense, nonce } from '../support/client'

/** A listening app with one license, a validate over its socket, and its app's IP blacklist. */
async function listening(env: Record<string, string> = {}) {
  const t = await makeTestApp({ env })
  const s = await t.seed()
  const key = await insertLicense(t.ctx, s.appId, { unlimitedHwidSlots: true })
  t.app.listen({ hostname: '127.0.0.1', port: 0 })
  const url = `http://127.0.0.1:${t.app.server?.port}/auth/validate`
  return {
    async validate(headers: Record<string, string> = {}) {
      const res = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body: JSON.stringify({ appId: s.appId, appSecret: s.appSecret, licenseKey: key, hwid: hwid(), nonce: nonce() }),
      })
      return { status: res.status, body: await res.json() }
    },
    async blacklist(ip: string) {
      const res = await t.req('PUT', `/v1/apps/${s.appId}/security`, { apiKey: s.apiKey, body: { ipBlacklist: [ip] } })
      expect(res.status).toBe(200)
    },
    stop: () => t.app.stop(true),
  }
}

const blocked = { status: 403, body: { status: 'failed', error: 'blocked' } }

// The in-process tests have no socket peer; here the client IP comes from the listening server.
test('over a socket the TCP peer is the client IP the lists see, whatever X-Forwarded-For says', async () => {
  const app = await listening()
  try {
    expect((await app.validate()).status).toBe(200)
    await app.blacklist('127.0.0.1')
    // No trusted proxies by default: a forwarded address is ignored, the peer is blocked.
    expect(await app.validate({ 'x-forwarded-for': '198.51.100.7' })).toEqual(blocked)
    expect(await app.validate()).toEqual(blocked)
  } finally {
    await app.stop()
  }
})

test('a peer that is a trusted proxy hands the client IP to X-Forwarded-For', async () => {
  const app = await listening({ TRUSTED_PROXIES: '127.0.0.1' })
  try {
    await app.blacklist('198.51.100.7')
    expect(await app.validate({ 'x-forwarded-for': '198.51.100.7' })).toEqual(blocked)
    expect((await app.validate({ 'x-forwarded-for': '198.51.100.8' })).status).toBe(200)
    expect((await app.validate()).status).toBe(200)
  } finally {
    await app.stop()
  }
})
