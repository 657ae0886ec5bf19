import { describe, expect, test } from 'bun:test'
import { generateKeyPairSync } from 'node:crypto'
import { chmodSync, existsSync, mkdtempSync, writeFileSync } from 'node:fs'
import { type AddressInfo, createServer } from 'node:net'
import { availableParallelism, tmpdir, totalmem } from 'node:os'
import { join } from 'node:path'
import { ConfigError, DEFAULT_PROCESSES_CAP, defaultCacheMb, loadConfig, usableMemoryMb } from '../src/config'
import { parseCidr } from '../src/lib/ip'
import { runToExit } from './support/server-process'
import { SERVICE_SETTINGS } from './support/service-settings'
import { testCertificate } from './support/webhooks-receiver'

const dir = mkdtempSync(join(tmpdir(), 'ls-config-'))
const certFile = join(dir, 'cert.pem')
const keyFile = join(dir, 'key.pem')
writeFileSync(certFile, testCertificate().cert)
writeFileSync(keyFile, testCertificate().key)
/** A private key, but not the certificate's. */
const otherKeyFile = join(dir, 'other-key.pem')
writeFileSync(otherKeyFile, generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ type: 'pkcs8', format: 'pem' }))

describe('defaults', () => {
  test('an empty environment gives the contract defaults', () => {
    expect(loadConfig({})).toEqual({
      host: '0.0.0.0',
      port: 3000,
      serverProcesses: 1,
      databaseUrl: null,
      dataDir: './data',
      redisUrl: null,
      redisClusterShards: null,
      trustedProxies: [],
      webhookAllowPrivateTargets: false,
      webhookExtraCaFile: null,
      sandboxDailyCeiling: 50_000,
      validateLimitPerIp: 300,
      validateLimitPerLicense: 300,
      selfbanLimitPerIp: 60,
      selfbanLimitPerLicense: 60,
      publicRateLimits: true,
      cacheMaxMb: Math.min(2048, Math.floor(usableMemoryMb() / 8)),
      cacheWarmUp: true,
      sessionTtlSeconds: 86_400,
      stallExitSeconds: 60,
      tlsCertFile: null,
      tlsKeyFile: null,
      masterKey: null,
      logLevel: 'info',
      metricsPort: null,
      metricsHost: '127.0.0.1',
    })
  })

  test('empty strings count as unset', () => {
    expect(loadConfig({ PORT: '', DATABASE_URL: '', REDIS_URL: '', LOG_LEVEL: '' })).toMatchObject({
      port: 3000,
      databaseUrl: null,
      redisUrl: null,
      logLevel: 'info',
    })
  })
})

describe('each setting is parsed', () => {
  test.each([
    ['HOST', '127.0.0.1', 'host', '127.0.0.1'],
    ['HOST', 'api.example.com', 'host', 'api.example.com'],
    ['HOST', '::', 'host', '::'],
    ['PORT', '8080', 'port', 8080],
    ['PORT', '0', 'port', 0],
    ['DATABASE_URL', 'postgres://u:p@db:5432/ls', 'databaseUrl', 'postgres://u:p@db:5432/ls'],
    ['DATABASE_URL', 'postgresql://db/ls', 'databaseUrl', 'postgresql://db/ls'],
    ['DATA_DIR', '/var/lib/ls', 'dataDir', '/var/lib/ls'],
    ['REDIS_URL', 'redis://cache:6379/3', 'redisUrl', 'redis://cache:6379/3'],
    ['REDIS_URL', 'rediss://cache:6380', 'redisUrl', 'rediss://cache:6380'],
    [
      'TRUSTED_PROXIES',
      '10.0.0.0/8, 192.168.1.1,::1',
      'trustedProxies',
      ['10.0.0.0/8', '192.168.1.1', '::1'].map(parseCidr),
    ],
    ['WEBHOOK_ALLOW_PRIVATE_TARGETS', 'true', 'webhookAllowPrivateTargets', true],
    ['WEBHOOK_ALLOW_PRIVATE_TARGETS', 'FALSE', 'webhookAllowPrivateTargets', false],
    ['NODE_EXTRA_CA_CERTS', certFile, 'webhookExtraCaFile', certFile],
    ['SANDBOX_DAILY_CEILING', '1000', 'sandboxDailyCeiling', 1000],
    ['VALIDATE_LIMIT_PER_IP', '120', 'validateLimitPerIp', 120],
    ['VALIDATE_LIMIT_PER_LICENSE', '90', 'validateLimitPerLicense', 90],
    ['SELFBAN_LIMIT_PER_IP', '10', 'selfbanLimitPerIp', 10],
    ['SELFBAN_LIMIT_PER_LICENSE', '5', 'selfbanLimitPerLicense', 5],
    ['SESSION_TTL_SECONDS', '3600', 'sessionTtlSeconds', 3600],
    ['SESSION_TTL_SECONDS', '604800', 'sessionTtlSeconds', 604_800],
    ['STALL_EXIT_SECONDS', '0', 'stallExitSeconds', 0],
    ['STALL_EXIT_SECONDS', '300', 'stallExitSeconds', 300],
    ['LOG_LEVEL', 'debug', 'logLevel', 'debug'],
    ['METRICS_PORT', '9464', 'metricsPort', 9464],
    ['METRICS_HOST', '0.0.0.0', 'metricsHost', '0.0.0.0'],
    ['MASTER_KEY', 'ab'.repeat(32), 'masterKey', Buffer.alloc(32, 0xab)],
    ['MASTER_KEY', Buffer.alloc(32, 1).toString('base64'), 'masterKey', Buffer.alloc(32, 1)],
  ] as const)('%s=%s', (name, value, field, expected) => {
    expect(loadConfig({ [name]: value })[field]).toEqual(expected as never)
  })

  test('SERVER_PROCESSES: a count or auto (one per core), with the shared database and store', () => {
    const shared = { DATABASE_URL: 'postgres://db/ls', REDIS_URL: 'redis://cache' }
    expect(loadConfig({ ...shared, SERVER_PROCESSES: '2' }).serverProcesses).toBe(2)
    expect(loadConfig({ ...shared, SERVER_PROCESSES: 'auto' }).serverProcesses).toBe(availableParallelism())
    expect(loadConfig({ SERVER_PROCESSES: '1' }).serverProcesses).toBe(1)
  })

  test('SERVER_PROCESSES unset: one per core (at most DEFAULT_PROCESSES_CAP) with the shared database and store, else one; auto: every core', () => {
    const shared = { DATABASE_URL: 'postgres://db/ls', REDIS_URL: 'redis://cache' }
    const byDefault = Math.min(availableParallelism(), DEFAULT_PROCESSES_CAP)
    expect(loadConfig(shared).serverProcesses).toBe(byDefault)
    expect(loadConfig({ ...shared, SERVER_PROCESSES: '' }).serverProcesses).toBe(byDefault)
    expect(loadConfig({ ...shared, SERVER_PROCESSES: 'auto' }).serverProcesses).toBe(availableParallelism())
    expect(loadConfig({ ...shared, SERVER_PROCESSES: '1' }).serverProcesses).toBe(1)
    expect(loadConfig({ DATABASE_URL: shared.DATABASE_URL }).serverProcesses).toBe(1)
    expect(loadConfig({ REDIS_URL: shared.REDIS_URL }).serverProcesses).toBe(1)
  })

  test('CACHE_MAX_MB unset: an eighth of the memory the server may use, split among its processes, at least 32', () => {
    const shared = { DATABASE_URL: 'postgres://db/ls', REDIS_URL: 'redis://cache' }
    expect(defaultCacheMb(24_105, 2)).toBe(1506)
    expect(defaultCacheMb(4096, 4)).toBe(128)
    expect(defaultCacheMb(512, 1)).toBe(64)
    expect(defaultCacheMb(128, 1)).toBe(32)
    expect(loadConfig({ ...shared, SERVER_PROCESSES: '2' }).cacheMaxMb).toBe(defaultCacheMb(usableMemoryMb(), 2))
    expect(loadConfig({ ...shared, SERVER_PROCESSES: '2', CACHE_MAX_MB: '300' }).cacheMaxMb).toBe(300)
  })

  test('CACHE_MAX_MB is at most 2048, set or not: a process holds its license records in one arena of at most 2 GiB', () => {
    expect(defaultCacheMb(64 * 1024, 2)).toBe(2048)
    expect(loadConfig({ CACHE_MAX_MB: '2048' }).cacheMaxMb).toBe(2048)
    expect(loadConfig({ CACHE_MAX_MB: '8192' }).cacheMaxMb).toBe(2048)
  })

  test('the memory the server may use is its cgroup limit when it has one below the machine\'s', () => {
    const constrained = process.constrainedMemory
    try {
      process.constrainedMemory = () => 1024 * 2 ** 20
      expect(usableMemoryMb()).toBe(1024)
      expect(loadConfig({}).cacheMaxMb).toBe(128)
      // Node's answer without a limit, and a limit above the machine's memory ("max" read as a huge number).
      process.constrainedMemory = () => 0
      expect(usableMemoryMb()).toBe(Math.floor(totalmem() / 2 ** 20))
      process.constrainedMemory = () => 2 ** 62
      expect(usableMemoryMb()).toBe(Math.floor(totalmem() / 2 ** 20))
    } finally {
      process.constrainedMemory = constrained
    }
  })

  test('REDIS_CLUSTER: the seed nodes of REDIS_URL, comma-separated, and the shards (64 unless REDIS_CLUSTER_SHARDS)', () => {
    const seeds = 'redis://:secret@node-a:7000, redis://node-b:7001'
    expect(loadConfig({ REDIS_URL: seeds, REDIS_CLUSTER: 'true' })).toMatchObject({
      redisUrl: 'redis://:secret@node-a:7000,redis://node-b:7001',
      redisClusterShards: 64,
    })
    expect(loadConfig({ REDIS_URL: 'rediss://node-a/0', REDIS_CLUSTER: 'true', REDIS_CLUSTER_SHARDS: '12' }).redisClusterShards).toBe(12)
    expect(loadConfig({ REDIS_URL: 'redis://cache', REDIS_CLUSTER: 'false' }).redisClusterShards).toBeNull()
  })

  test('TLS_CERT_FILE and TLS_KEY_FILE together', () => {
    const config = loadConfig({ TLS_CERT_FILE: certFile, TLS_KEY_FILE: keyFile })
    expect([config.tlsCertFile, config.tlsKeyFile]).toEqual([certFile, keyFile])
  })
})

describe('a bad value is a ConfigError naming the setting', () => {
  test.each([
    ['HOST', 'not a host!'],
    ['METRICS_HOST', 'not a host!'],
    ['METRICS_PORT', '0'],
    ['METRICS_PORT', '3000'],
    ['PORT', 'eighty'],
    ['PORT', '65536'],
    ['PORT', '-1'],
    ['DATABASE_URL', 'mysql://db/ls'],
    ['DATABASE_URL', 'not a url'],
    // The service's own connection name is how master-key rotate sees a running server.
    ['DATABASE_URL', 'postgres://db/ls?application_name=billing-api'],
    ['DATABASE_URL', 'postgres://db/ls?options=-c%20application_name%3Dbilling-api'],
    ['DATABASE_URL', 'postgres://db/ls?APPLICATION_NAME=billing-api'],
    ['REDIS_URL', 'http://cache'],
    ['TRUSTED_PROXIES', '10.0.0.0/8,nope'],
    ['TRUSTED_PROXIES', '10.0.0.0/33'],
    ['TRUSTED_PROXIES', '010.0.0.0/8'],
    ['TRUSTED_PROXIES', 'fe80::%eth0/10'],
    ['WEBHOOK_ALLOW_PRIVATE_TARGETS', 'maybe'],
    ['SANDBOX_DAILY_CEILING', '0'],
    ['VALIDATE_LIMIT_PER_IP', '1.5'],
    ['VALIDATE_LIMIT_PER_LICENSE', 'lots'],
    ['SELFBAN_LIMIT_PER_IP', '0'],
    ['SELFBAN_LIMIT_PER_LICENSE', '-3'],
    ['SESSION_TTL_SECONDS', '3599'],
    ['SESSION_TTL_SECONDS', '604801'],
    ['STALL_EXIT_SECONDS', '-1'],
    ['STALL_EXIT_SECONDS', '86401'],
    ['LOG_LEVEL', 'verbose'],
    ['MASTER_KEY', 'short'],
    // Base64 of 32 bytes but for what base64 decoding would skip: another key than the one meant.
    ['MASTER_KEY', `"${Buffer.alloc(32, 1).toString('base64')}`],
    ['MASTER_KEY', `!!!${Buffer.alloc(32, 1).toString('base64').slice(3)}`],
    ['REDIS_URL', 'redis://cache/abc'],
    ['REDIS_URL', 'redis://cache/1/2'],
    ['TLS_CERT_FILE', join(dir, 'missing.pem')],
    ['TLS_CERT_FILE', dir],
    ['TLS_CERT_FILE', keyFile],
    ['TLS_KEY_FILE', certFile],
    ['TLS_KEY_FILE', otherKeyFile],
    ['NODE_EXTRA_CA_CERTS', join(dir, 'missing.pem')],
    ['NODE_EXTRA_CA_CERTS', keyFile],
    ['SERVER_PROCESSES', '0'],
    ['SERVER_PROCESSES', 'many'],
    ['SERVER_PROCESSES', '2'],
  ] as const)('%s=%s', (name, value) => {
    const env: Record<string, string> = { [name]: value }
    // The TLS pair must be complete for the file checks to be the ones that fire.
    if (name === 'TLS_CERT_FILE') env.TLS_KEY_FILE = keyFile
    if (name === 'TLS_KEY_FILE') env.TLS_CERT_FILE = certFile
    expect(() => loadConfig(env)).toThrow(ConfigError)
    expect(() => loadConfig(env)).toThrow(name)
  })

  test.each([
    [{ REDIS_CLUSTER: 'true' }, /REDIS_CLUSTER=true needs REDIS_URL/],
    [{ REDIS_CLUSTER: 'yes please', REDIS_URL: 'redis://a' }, /REDIS_CLUSTER must be true or false/],
    [{ REDIS_URL: 'redis://a:7000,redis://b:7001' }, /REDIS_URL names several nodes: set REDIS_CLUSTER=true/],
    [{ REDIS_CLUSTER: 'true', REDIS_URL: 'redis://a:7000,,redis://b' }, /REDIS_URL has an empty entry/],
    [{ REDIS_CLUSTER: 'true', REDIS_URL: 'redis://a:7000,http://b' }, /REDIS_URL must start with redis:\/\/ or rediss:\/\//],
    [{ REDIS_CLUSTER: 'true', REDIS_URL: 'redis://a:7000/3' }, /REDIS_URL names database 3: a Redis Cluster has database 0 only/],
    [{ REDIS_CLUSTER: 'true', REDIS_URL: 'redis://a', REDIS_CLUSTER_SHARDS: '0' }, /REDIS_CLUSTER_SHARDS must be between 2 and 16384/],
    [{ REDIS_URL: 'redis://a:6379/db' }, /REDIS_URL's path must be a database number/],
    // Unused without a cluster, and checked all the same: found now, not when the cluster is switched on.
    [{ REDIS_URL: 'redis://a', REDIS_CLUSTER_SHARDS: 'banana' }, /REDIS_CLUSTER_SHARDS/],
    [{ REDIS_CLUSTER_SHARDS: '1' }, /REDIS_CLUSTER_SHARDS must be between 2 and 16384/],
    // One shard would leave the keys untagged, scattered over a cluster's slots.
    [{ REDIS_CLUSTER: 'true', REDIS_URL: 'redis://a', REDIS_CLUSTER_SHARDS: '1' }, /REDIS_CLUSTER_SHARDS must be between 2 and 16384/],
  ])('Redis Cluster settings: %o', (env, message) => {
    expect(() => loadConfig(env)).toThrow(ConfigError)
    expect(() => loadConfig(env)).toThrow(message)
  })

  test('a password with an unencoded "/" is read as the path, and the refusal does not print it', () => {
    for (const password of ['/Sx9+kQzPLANTED', '4821/xYzPLANTED']) {
      for (const env of [{ REDIS_URL: `redis://default:${password}@redis.internal:6379/0` }, { REDIS_CLUSTER: 'true', REDIS_URL: `redis://a:7000,redis://default:${password}@b:7001` }]) {
        let message = ''
        try {
          loadConfig(env)
        } catch (err) {
          message = (err as Error).message
        }
        expect(message).toContain("REDIS_URL's path must be a database number")
        expect(message).not.toContain('PLANTED')
      }
    }
  })

  test('a "%" in a URL\'s credentials that is no escape is a setting, named, the credentials not printed', () => {
    for (const env of [
      { REDIS_URL: 'redis://:p%zzPLANTED@cache:6379' },
      { REDIS_CLUSTER: 'true', REDIS_URL: 'redis://a:7000,redis://user%:PLANTED@b:7001' },
      { DATABASE_URL: 'postgres://app:100%PLANTED@db/ls' },
    ]) {
      const name = Object.keys(env).at(-1)!
      expect(() => loadConfig(env)).toThrow(new ConfigError(`${name}'s user name or password has a "%" that is not an escape: write "%" as %25`))
    }
    expect(loadConfig({ REDIS_URL: 'redis://:100%25@cache:6379' }).redisUrl).toBe('redis://:100%25@cache:6379')
  })

  test('TLS_CERT_FILE without TLS_KEY_FILE', () => {
    expect(() => loadConfig({ TLS_CERT_FILE: certFile })).toThrow(/TLS_CERT_FILE and TLS_KEY_FILE/)
  })
})

test.each([
  ['PORT', { PORT: 'eighty' }],
  // Found only when used: a file where the directory should be, a host name that does not resolve, an
  // address that is not this machine's. Each before the database is opened, as one line naming it.
  ['DATA_DIR', { DATA_DIR: join(certFile, 'data') }],
  ['HOST', { HOST: 'no-such-host.invalid' }],
  ['HOST', { HOST: '192.0.2.55' }],
  ['METRICS_HOST', { METRICS_HOST: 'no-such-host.invalid', METRICS_PORT: '19091' }],
  ['METRICS_HOST', { METRICS_HOST: '192.0.2.55', METRICS_PORT: '19091' }],
])('the server exits 2 with one stderr line naming a bad %s', async (name, env) => {
  const { code, stdout, stderr } = await runToExit(['src/main.ts'], { DATA_DIR: mkdtempSync(join(tmpdir(), 'ls-config-')), PORT: '0', ...env })
  expect(stdout).toBe('')
  const lines = stderr.trimEnd().split('\n')
  expect(lines).toHaveLength(1)
  expect(lines[0]).toStartWith('configuration error: ')
  expect(lines[0]).toContain(name)
  expect(code).toBe(2)
})

test('a METRICS_PORT another process listens on: exit 1 with one line naming it, before the database opens', async () => {
  const busy = createServer()
  const port = await new Promise<number>((resolve) => busy.listen(0, '127.0.0.1', () => resolve((busy.address() as AddressInfo).port)))
  try {
    const dataDir = mkdtempSync(join(tmpdir(), 'ls-config-'))
    const { code, stderr } = await runToExit(['src/main.ts'], { DATA_DIR: dataDir, PORT: '0', METRICS_HOST: '127.0.0.1', METRICS_PORT: String(port) })
    expect(stderr).toBe(`error: METRICS_HOST=127.0.0.1 METRICS_PORT=${port} is in use\n`)
    expect(code).toBe(1)
    expect(existsSync(join(dataDir, 'pglite'))).toBe(false)
  } finally {
    busy.close()
  }
})

// Another user's directory needs a user without root's override of file modes: root drops to nobody.
const asAnotherUser = process.getuid?.() === 0 && Bun.which('setpriv') !== null
if (!asAnotherUser) console.warn('SKIPPED: an unwritable DATA_DIR needs root and setpriv (util-linux) to run the server as another user')
test.skipIf(!asAnotherUser)('a DATA_DIR that exists but this user cannot write: exit 2 with one line naming it', async () => {
  const dataDir = mkdtempSync(join(tmpdir(), 'ls-config-'))
  chmodSync(dataDir, 0o755)
  const run = Bun.spawn(['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, 'src/main.ts'], {
    cwd: join(import.meta.dir, '..'),
    env: { ...process.env, HOME: tmpdir(), DATA_DIR: dataDir, PORT: '0' },
    stdout: 'pipe',
    stderr: 'pipe',
  })
  const [code, stderr] = await Promise.all([run.exited, new Response(run.stderr).text()])
  expect(stderr).toBe(`configuration error: DATA_DIR is not writable by this user: "${dataDir}" (EACCES)\n`)
  expect(code).toBe(2)
})

test("a test run drops the service's settings from its environment: a shell set up for production points no test's server at its database", async () => {
  const file = join(mkdtempSync(join(tmpdir(), 'ls-env-')), 'env.test.ts')
  writeFileSync(
    file,
    `import { expect, test } from 'bun:test'
test('the settings are gone', () => expect(${JSON.stringify(SERVICE_SETTINGS)}.filter((name) => name in process.env)).toEqual([]))
`,
  )
  const shell = Object.fromEntries(SERVICE_SETTINGS.map((name) => [name, 'from-the-shell']))
  const run = await runToExit(['test', file], shell)
  expect(run.stderr).toContain('1 pass')
  expect(run.code).toBe(0)
})
