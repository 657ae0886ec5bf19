import { writeFileSync } from 'node:fs'
import { createAccount } from '../src/accounts/service'
import { createApplication } from '../src/apps/service'
import { buildContext } from '../src/boot'
import { MAX_SESSION_TTL } from '../src/signing/session'
import { loadConfig } from '../src/config'
import { generateLicenseKey } from '../src/lib/crypto'
import { sql } from 'drizzle-orm'
import { licenses as licenseTable } from '../src/db/schema'

/** What the benches drive: one billed account, one app, licenses with one bound HWID and a session each. */
export interface Seeded {
  accountId: string
  apiKey: string
  appId: string
  appSecret: string
  licenses: { key: string; hwid: string; token: string }[]
}

/**
 * Seeds through the server's own code, against the database and master key of the server's settings
 * (`env`), so the sessions verify there. Licenses go in with their HWID already bound: measured rounds
 * never pay for a first binding.
 */
export async function seedBench(env: Record<string, string>, count: number): Promise<Seeded> {
  const ctx = await buildContext(loadConfig(env))
  try {
    const account = await createAccount(ctx, 'bench', 1_000_000_000)
    const app = await createApplication(ctx, account.accountId, 'bench', false)
    const rows = Array.from({ length: count }, (_, i) => ({
      key: generateLicenseKey(),
      appId: app.appId,
      hwids: [`bench-hwid-${i.toString(16).padStart(8, '0')}`],
    }))
    for (let i = 0; i < rows.length; i += 500) await ctx.database.db.insert(licenseTable).values(rows.slice(i, i + 500))
    const licenses = rows.map(({ key, hwids: [hwid = ''] }) => ({
      key,
      hwid,
      token: ctx.sessions.issue({ app: app.appId, lic: key, hwid, ttl: MAX_SESSION_TTL }, null, Date.now()).token,
    }))
    return { ...account, appId: app.appId, appSecret: app.appSecret, licenses }
  } finally {
    await ctx.webhookPool.close()
    await ctx.store.close()
    await ctx.database.close()
  }
}

/** The key of the `i`-th license of a bulk set (seedBulk); bench/scale.lua spells it the same way. */
const bulkKeySql = (prefix: string) =>
  `'${prefix}-' || substr(lpad(i::text, 12, '0'), 1, 4) || '-' || substr(lpad(i::text, 12, '0'), 5, 4) || '-' || substr(lpad(i::text, 12, '0'), 9, 4)`

/**
 * One app per set, each with `count` licenses whose HWID `h<i>` is already bound, written by one
 * `INSERT … SELECT generate_series` per set: a million rows in seconds, where the API's own path
 * would take minutes. Keys are `<prefix>-0000-0000-0000` numbered from 0.
 */
export async function seedBulk(
  env: Record<string, string>,
  sets: { prefix: string; count: number }[],
): Promise<{ appId: string; appSecret: string; prefix: string; count: number }[]> {
  const ctx = await buildContext(loadConfig(env))
  try {
    const account = await createAccount(ctx, 'bench', 1_000_000_000)
    const seeded = []
    for (const { prefix, count } of sets) {
      if (!/^[A-Z]{4}$/.test(prefix)) throw new Error('a bulk prefix is four capital letters')
      const app = await createApplication(ctx, account.accountId, prefix, false)
      await ctx.database.db.execute(
        sql.raw(
          `INSERT INTO licenses (key, app_id, hwids) SELECT ${bulkKeySql(prefix)}, '${app.appId}', ARRAY['h' || i] FROM generate_series(0, ${count - 1}) AS i`,
        ),
      )
      seeded.push({ appId: app.appId, appSecret: app.appSecret, prefix, count })
    }
    await ctx.database.db.execute(sql`ANALYZE licenses`)
    return seeded
  } finally {
    await ctx.webhookPool.close()
    await ctx.store.close()
    await ctx.database.close()
  }
}

/**
 * Seeds `count` licenses (seedBench) and writes the data file bench/auth.lua reads: "<appId> <appSecret>",
 * then "<licenseKey> <hwid> <sessionToken>" a line.
 */
export async function seedAuthData(env: Record<string, string>, count: number, path: string): Promise<Seeded> {
  const seeded = await seedBench(env, count)
  const lines = seeded.licenses.map((l) => `${l.key} ${l.hwid} ${l.token}`)
  writeFileSync(path, `${seeded.appId} ${seeded.appSecret}\n${lines.join('\n')}\n`)
  return seeded
}
