import { createAccount } from '../src/accounts/service'
import { createApplication } from '../src/apps/service'
import { buildContext } from '../src/boot'
import { MAX_SESSION_TTL } from '../src/signing/session'
import { loadConfig } from '../src/config'
import { generateLicenseKey } from '../src/lib/crypto'
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
      token: ctx.sessions.issue({ app: app.appId, lic: key, hwid, ttl: MAX_SESSION_TTL }, Date.now()).token,
    }))
    return { ...account, appId: app.appId, appSecret: app.appSecret, licenses }
  } finally {
    await ctx.webhookPool.close()
    await ctx.store.close()
    await ctx.database.close()
  }
}
