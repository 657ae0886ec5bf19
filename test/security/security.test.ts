import { beforeAll, describe, expect, test } from 'bun:test'
import { createApiKey, revokeApiKey } from '../../src/accounts/service'
import { makeTestApp, type TestApp } from '../support/helpers'
import { appEpochKey } from '../support/client'

const errorBody = (error: string) => ({ error, message: expect.any(String) })
const empty = { hwidBlacklist: [], hwidWhitelist: [], ipBlacklist: [], ipWhitelist: [] }

let t: TestApp
beforeAll(async () => {
  t = await makeTestApp()
})

type Seeded = Awaited<ReturnType<TestApp['seed']>>

const security = (s: Seeded) => t.req('GET', `/v1/apps/${s.appId}/security`, { apiKey: s.apiKey })
const put = (s: Seeded, body: unknown) =>
  t.req('PUT', `/v1/apps/${s.appId}/security`, { apiKey: s.apiKey, body })
const entry = (
  s: Seeded,
  method: 'POST' | 'DELETE',
  list: 'blacklist' | 'whitelist',
  body: unknown,
) => t.req(method, `/v1/apps/${s.appId}/security/${list}`, { apiKey: s.apiKey, body })

async function appEpoch(s: Seeded) {
  const [epoch] = await t.ctx.store.epochs([await appEpochKey(t.ctx, s.appId)])
  return epoch ?? 0
}

describe('GET and PUT /v1/apps/:appId/security', () => {
  test('a new app has four empty lists', async () => {
    const s = await t.seed()
    const res = await security(s)
    expect(res.status).toBe(200)
    expect(res.body).toEqual(empty)
  })

  test('PUT replaces only the supplied lists, deduplicates in order and stores IPs canonical', async () => {
    const s = await t.seed()
    const first = await put(s, {
      hwidBlacklist: ['b', 'a', 'b'],
      ipWhitelist: ['::ffff:10.0.0.1', '10.0.0.1', '2001:DB8:0:0:0:0:0:1', '192.168.1.1'],
    })
    expect(first.status, JSON.stringify(first.body)).toBe(200)
    expect(first.body).toEqual({
      hwidBlacklist: ['b', 'a'],
      hwidWhitelist: [],
      ipBlacklist: [],
      ipWhitelist: ['10.0.0.1', '2001:db8::1', '192.168.1.1'],
    })
    const second = await put(s, { hwidWhitelist: ['w'], ipWhitelist: [] })
    expect(second.body).toEqual({
      hwidBlacklist: ['b', 'a'],
      hwidWhitelist: ['w'],
      ipBlacklist: [],
      ipWhitelist: [],
    })
    expect((await security(s)).body).toEqual(second.body)
  })

  test('PUT with an empty body changes nothing', async () => {
    const s = await t.seed()
    await put(s, { ipBlacklist: ['1.2.3.4'] })
    const res = await put(s, {})
    expect(res.status).toBe(200)
    expect(res.body).toEqual({ ...empty, ipBlacklist: ['1.2.3.4'] })
  })

  test('PUT accepts 1,000 entries and bumps the app epoch', async () => {
    const s = await t.seed()
    const before = await appEpoch(s)
    const hwids = Array.from({ length: 1000 }, (_, i) => `hw-${i}`)
    const res = await put(s, { hwidBlacklist: hwids })
    expect(res.status).toBe(200)
    expect(res.body.hwidBlacklist).toEqual(hwids)
    expect(await appEpoch(s)).toBeGreaterThan(before)
  })

  describe.each([
    ['1,001 entries', { hwidBlacklist: Array.from({ length: 1001 }, (_, i) => `hw-${i}`) }],
    ['an empty HWID', { hwidBlacklist: [''] }],
    ['an HWID of 129 characters', { hwidWhitelist: ['h'.repeat(129)] }],
    ['an IP that is not an address', { ipBlacklist: ['not.an.ip.addr'] }],
    ['an IP range', { ipBlacklist: ['10.0.0.0/8'] }],
    ['an IP of 6 characters', { ipWhitelist: ['1.2.3.'] }],
    ['a list that is not an array', { ipWhitelist: '1.2.3.4' }],
    ['an entry that is not a string', { hwidBlacklist: [42] }],
  ])('PUT 400 bad_request: %s', (_name, body) => {
    test('is refused and nothing changes', async () => {
      const s = await t.seed()
      await put(s, { hwidBlacklist: ['keep'] })
      const res = await put(s, body)
      expect(res.status, JSON.stringify(res.body)).toBe(400)
      expect(res.body).toEqual(errorBody('bad_request'))
      expect((await security(s)).body).toEqual({ ...empty, hwidBlacklist: ['keep'] })
    })
  })

  test("403 for another account's app and for an absent app", async () => {
    const s = await t.seed()
    const other = await t.seed()
    for (const appId of [other.appId, '00000000-0000-4000-8000-000000000000', 'nope']) {
      for (const [method, body] of [
        ['GET', undefined],
        ['PUT', { hwidBlacklist: ['x'] }],
      ] as const) {
        const res = await t.req(method, `/v1/apps/${appId}/security`, { apiKey: s.apiKey, body })
        expect(res.status, `${method} ${appId}`).toBe(403)
        expect(res.body).toEqual(errorBody('forbidden'))
      }
    }
    expect((await security(other)).body).toEqual(empty)
  })
})

describe('POST and DELETE /v1/apps/:appId/security/{blacklist,whitelist}', () => {
  test.each(['blacklist', 'whitelist'] as const)(
    '%s: add and remove HWID and IP entries',
    async (list) => {
      const s = await t.seed()
      const hwidList = list === 'blacklist' ? 'hwidBlacklist' : 'hwidWhitelist'
      const ipList = list === 'blacklist' ? 'ipBlacklist' : 'ipWhitelist'
      const before = await appEpoch(s)
      const add = await entry(s, 'POST', list, { type: 'hwid', value: 'device-1' })
      expect(add.status).toBe(200)
      expect(add.body).toEqual({ ok: true })
      await entry(s, 'POST', list, { type: 'ip', value: '::ffff:127.0.0.1' })
      await entry(s, 'POST', list, { type: 'ip', value: '2001:0db8:0000:0000:0000:0000:0000:0001' })
      expect((await security(s)).body).toEqual({
        ...empty,
        [hwidList]: ['device-1'],
        [ipList]: ['127.0.0.1', '2001:db8::1'],
      })
      expect(await appEpoch(s)).toBeGreaterThan(before)

      // Removal matches canonically too.
      const remove = await entry(s, 'DELETE', list, { type: 'ip', value: '2001:db8:0:0::1' })
      expect(remove.body).toEqual({ ok: true })
      await entry(s, 'DELETE', list, { type: 'hwid', value: 'device-1' })
      expect((await security(s)).body).toEqual({ ...empty, [ipList]: ['127.0.0.1'] })
    },
  )

  test('adding a present entry and removing an absent one are no-op 200s that leave the epoch alone', async () => {
    const s = await t.seed()
    await entry(s, 'POST', 'blacklist', { type: 'hwid', value: 'dup' })
    const epoch = await appEpoch(s)
    const again = await entry(s, 'POST', 'blacklist', { type: 'hwid', value: 'dup' })
    expect(again.status).toBe(200)
    expect(again.body).toEqual({ ok: true })
    const absent = await entry(s, 'DELETE', 'whitelist', { type: 'ip', value: '8.8.8.8' })
    expect(absent.status).toBe(200)
    expect(absent.body).toEqual({ ok: true })
    expect((await security(s)).body).toEqual({ ...empty, hwidBlacklist: ['dup'] })
    expect(await appEpoch(s)).toBe(epoch)
  })

  test('a list of 999 takes one more entry; a full list of 1,000 refuses the 1,001st with 400', async () => {
    const s = await t.seed()
    await put(s, { hwidWhitelist: Array.from({ length: 999 }, (_, i) => `hw-${i}`) })
    expect((await entry(s, 'POST', 'whitelist', { type: 'hwid', value: 'hw-999' })).status).toBe(
      200,
    )
    const full = await entry(s, 'POST', 'whitelist', { type: 'hwid', value: 'hw-1000' })
    expect(full.status).toBe(400)
    expect(full.body).toEqual(errorBody('bad_request'))
    // Present entries are still a no-op success on a full list.
    expect((await entry(s, 'POST', 'whitelist', { type: 'hwid', value: 'hw-5' })).status).toBe(200)
    const after = await security(s)
    expect(after.body.hwidWhitelist).toHaveLength(1000)
    expect(after.body.hwidWhitelist.at(-1)).toBe('hw-999')
  })

  test('concurrent adds of distinct and equal values neither duplicate nor lose entries', async () => {
    const s = await t.seed()
    const values = ['a', 'b', 'c', 'a', 'b', 'c', 'd', 'd']
    const results = await Promise.all(
      values.map((value) => entry(s, 'POST', 'blacklist', { type: 'hwid', value })),
    )
    expect(results.every((r) => r.status === 200)).toBe(true)
    expect([...(await security(s)).body.hwidBlacklist].sort()).toEqual(['a', 'b', 'c', 'd'])
  })

  test('adding an entry another process removes at the same time is never answered as a full list', async () => {
    // A second process on the same database and store: its mailbox does not order its writes with ours.
    const other = await makeTestApp()
    const s = await t.seed()
    const path = `/v1/apps/${s.appId}/security/whitelist`
    const answers: string[] = []
    for (let i = 0; i < 60; i++) {
      const body = { type: 'hwid', value: `device-${i}` }
      expect((await t.req('POST', path, { apiKey: s.apiKey, body })).status).toBe(200)
      const [add, remove] = await Promise.all([
        t.req('POST', path, { apiKey: s.apiKey, body }),
        other.req('DELETE', path, { apiKey: s.apiKey, body }),
      ])
      answers.push(`${add.status} ${add.body.message ?? ''}/${remove.status}`)
      // Within the API key's 50 requests a second.
      await Bun.sleep(40)
    }
    expect(answers.filter((a) => a !== '200 /200')).toEqual([])
  }, 30_000)

  describe.each([
    ['hwid of 1 character', 'hwid', 'h'],
    ['hwid of 128 characters', 'hwid', 'h'.repeat(128)],
    ['shortest IPv4 (7 characters)', 'ip', '1.1.1.1'],
    ['IPv4 of 15 characters', 'ip', '255.255.255.255'],
    ['IPv6 loopback', 'ip', '0:0:0:0:0:0:0:1'],
    ['IPv6 of 45 characters', 'ip', 'ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255'],
  ])('accepts %s', (_name, type, value) => {
    test('adds it', async () => {
      const s = await t.seed()
      const res = await entry(s, 'POST', 'blacklist', { type, value })
      expect(res.status, JSON.stringify(res.body)).toBe(200)
      const lists = (await security(s)).body
      expect(lists[type === 'hwid' ? 'hwidBlacklist' : 'ipBlacklist']).toHaveLength(1)
    })
  })

  test('an IPv6 address shorter in canonical form than 7 characters goes back as the lists show it (put, added again, removed), and only so', async () => {
    const s = await t.seed()
    // Nothing new under the spec's 7 characters, whether added or put.
    expect((await entry(s, 'POST', 'blacklist', { type: 'ip', value: '::1' })).status).toBe(400)
    expect((await put(s, { ipBlacklist: ['::1'] })).status).toBe(400)
    expect((await security(s)).body).toEqual(empty)
    expect((await entry(s, 'POST', 'blacklist', { type: 'ip', value: '0:0:0:0:0:0:0:1' })).status).toBe(200)
    const listed = (await security(s)).body
    expect(listed.ipBlacklist).toEqual(['::1'])
    const putBack = await put(s, listed)
    expect(putBack.status, JSON.stringify(putBack.body)).toBe(200)
    expect(putBack.body).toEqual(listed)
    // Added again as listed: present, so a 200 that changes nothing, as for any other entry.
    const again = await entry(s, 'POST', 'blacklist', { type: 'ip', value: '::1' })
    expect(again.status, JSON.stringify(again.body)).toBe(200)
    expect((await security(s)).body).toEqual(listed)
    const removed = await entry(s, 'DELETE', 'blacklist', { type: 'ip', value: '::1' })
    expect(removed.status, JSON.stringify(removed.body)).toBe(200)
    expect((await security(s)).body).toEqual(empty)
  })

  test('a PUT that keeps a short IP, beside a DELETE of it from another process, ends as one of the two in turn', async () => {
    // Either the PUT went first (the DELETE then removed the entry) or the DELETE did (the PUT is then a
    // 400: nothing new under 7 characters); never both 200 with the entry back in the list.
    const other = await makeTestApp()
    for (let round = 0; round < 20; round++) {
      const s = await t.seed()
      expect((await put(s, { ipBlacklist: ['0:0:0:0:0:0:0:1', '1.2.3.4'] })).body.ipBlacklist).toEqual(['::1', '1.2.3.4'])
      const remove = () => other.req('DELETE', `/v1/apps/${s.appId}/security/blacklist`, { apiKey: s.apiKey, body: { type: 'ip', value: '::1' } })
      const keep = () => put(s, { ipBlacklist: ['::1', '1.2.3.4'] })
      const [kept, removed] = round % 2 ? await Promise.all([keep(), remove()]) : (await Promise.all([remove(), keep()])).reverse()
      const outcome = `PUT ${kept!.status}, DELETE ${removed!.status}, ${JSON.stringify((await security(s)).body.ipBlacklist)}`
      expect(['PUT 200, DELETE 200, ["1.2.3.4"]', 'PUT 400, DELETE 200, ["1.2.3.4"]']).toContain(outcome)
    }
  })

  describe.each([
    ['an empty hwid', { type: 'hwid', value: '' }],
    ['an hwid of 129 characters', { type: 'hwid', value: 'h'.repeat(129) }],
    ['an IP of 6 characters', { type: 'ip', value: '::1:2:' }],
    ['an IP of 4 characters, not as the lists show it', { type: 'ip', value: '0::1' }],
    ['an IP of 46 characters', { type: 'ip', value: `${'0:'.repeat(19)}1.2.3.45` }],
    ['a well-sized string that is no IP', { type: 'ip', value: '999.1.1.1' }],
    ['an IP with a zone ID', { type: 'ip', value: 'fe80::1%eth0' }],
    ['an IP with a port', { type: 'ip', value: '1.2.3.4:80' }],
    ['an unknown type', { type: 'email', value: 'a@b.c' }],
    ['a missing value', { type: 'hwid' }],
    ['a missing type', { value: 'x' }],
    ['a value that is not a string', { type: 'hwid', value: 12 }],
  ])('400 bad_request: %s', (_name, body) => {
    test.each([
      ['POST', 'blacklist'],
      ['DELETE', 'blacklist'],
      ['POST', 'whitelist'],
      ['DELETE', 'whitelist'],
    ] as const)('%s %s', async (method, list) => {
      const s = await t.seed()
      const res = await entry(s, method, list, body)
      expect(res.status, JSON.stringify(res.body)).toBe(400)
      expect(res.body).toEqual(errorBody('bad_request'))
      expect((await security(s)).body).toEqual(empty)
    })
  })

  test("403 for another account's app on every entry route; its lists stay untouched", async () => {
    const s = await t.seed()
    const other = await t.seed()
    for (const method of ['POST', 'DELETE'] as const) {
      for (const list of ['blacklist', 'whitelist']) {
        const res = await t.req(method, `/v1/apps/${other.appId}/security/${list}`, {
          apiKey: s.apiKey,
          body: { type: 'hwid', value: 'x' },
        })
        expect(res.status).toBe(403)
        expect(res.body).toEqual(errorBody('forbidden'))
      }
    }
    expect((await security(other)).body).toEqual(empty)
  })
})

test.each([
  ['no key', async () => undefined],
  ['an unknown key', async () => 'svc_live_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB'],
  [
    'a revoked key',
    async (s: Seeded) => {
      const apiKey = await createApiKey(t.ctx, s.accountId)
      await revokeApiKey(t.ctx, apiKey)
      return apiKey
    },
  ],
])('401 invalid_api_key with %s on every security route', async (_name, keyOf) => {
  const s = await t.seed()
  const apiKey = await keyOf(s)
  const body = { type: 'hwid', value: 'x' }
  for (const [method, path, b] of [
    ['GET', '', undefined],
    ['PUT', '', { hwidBlacklist: ['x'] }],
    ['POST', '/blacklist', body],
    ['DELETE', '/blacklist', body],
    ['POST', '/whitelist', body],
    ['DELETE', '/whitelist', body],
  ] as const) {
    const res = await t.req(method, `/v1/apps/${s.appId}/security${path}`, { apiKey, body: b })
    expect(res.status, `${method} ${path}`).toBe(401)
    expect(res.body).toEqual(errorBody('invalid_api_key'))
  }
  expect((await security(s)).body).toEqual(empty)
})
