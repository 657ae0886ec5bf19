/**
 * compose.yml against what it must agree with and what no Docker here can check: the settings
 * src/config.ts reads, the port the server listens on and the image exposes, Redis persistence, the
 * start order, and secrets that come from .env (git-ignored, kept out of the image) and never from the file.
 */
import { describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import ipaddr from 'ipaddr.js'
import { loadConfig } from '../../src/config'
import { LOW_FD_LIMIT } from '../../src/lib/process-metrics'
import { healthcheckCommand, parseDockerfile } from './dockerfile'

const ROOT = join(import.meta.dir, '..', '..')
const read = (file: string) => readFileSync(join(ROOT, file), 'utf8')

interface Service {
  image?: string
  build?: unknown
  restart?: string
  command?: string | string[]
  environment?: Record<string, string>
  ports?: string[]
  volumes?: string[]
  depends_on?: Record<string, { condition: string }>
  healthcheck?: { test: string[] }
  profiles?: string[]
  ulimits?: { nofile?: number | { soft: number; hard: number } }
  networks?: Record<string, { ipv4_address?: string }>
}
interface Compose {
  services: Record<string, Service>
  volumes: Record<string, unknown>
  networks: { default: { ipam: { config: { subnet: string; ip_range?: string; gateway?: string }[] } } }
}

const compose = Bun.YAML.parse(read('compose.yml')) as Compose
const { server, postgres, redis, proxy } = compose.services as Record<string, Service>
if (!server || !postgres || !redis || !proxy) throw new Error('compose.yml lacks server, postgres, redis or proxy')

/** .env.example's assignments (comments and blank lines skipped). */
const example = Object.fromEntries(
  read('.env.example')
    .split('\n')
    .filter((line) => /^[A-Z_][A-Z0-9_]*=/.test(line))
    .map((line) => [line.slice(0, line.indexOf('=')), line.slice(line.indexOf('=') + 1)]),
)

// What `cp .env.example .env` and the three secrets filled in give compose to interpolate.
const dotenv: Record<string, string> = Object.fromEntries(
  Object.entries(example).map(([name, value]) => [name, value === '' ? randomBytes(32).toString('hex') : value]),
)

const REFERENCE = /\$\{([A-Z_][A-Z0-9_]*)(?:(:?[-?])([^}]*))?\}/g

/** Compose's interpolation of `${NAME}`, `${NAME:-default}` and `${NAME:?error}` from `vars`. */
function interpolate(value: string, vars: Record<string, string>): string {
  return value.replace(REFERENCE, (_, name: string, op: string | undefined, word: string) => {
    const set = vars[name]
    if (set !== undefined && set !== '') return set
    if (op?.endsWith('?')) throw new Error(`${name} is required: ${word}`)
    return op?.endsWith('-') ? word : ''
  })
}

const interpolated = (env: Record<string, string> = {}) =>
  Object.fromEntries(Object.entries(env).map(([name, value]) => [name, interpolate(String(value), dotenv)]))

const serverEnv = interpolated(server.environment)

/** The variables compose.yml refuses to start without (`${NAME:?…}`). */
const required = new Set([...read('compose.yml').matchAll(REFERENCE)].filter((m) => m[2]?.endsWith('?')).map((m) => m[1] as string))

describe('compose.yml', () => {
  test('every variable it sets for the server is a setting src/config.ts reads, and together they are valid', () => {
    const names = new Set<string>()
    const recording = new Proxy(serverEnv, {
      get(target, name) {
        if (typeof name === 'string') names.add(name)
        return target[name as string]
      },
    })
    const config = loadConfig(recording)
    expect(Object.keys(serverEnv).filter((name) => !names.has(name))).toEqual([])
    // The production shape: shared database and store, a real master key.
    expect(config.databaseUrl).not.toBeNull()
    expect(config.redisUrl).not.toBeNull()
    expect(config.masterKey?.length).toBe(32)
  })

  test('the server publishes, on the loopback only, the port it listens on and the image exposes; the proxy forwards to it', () => {
    const port = loadConfig(serverEnv).port
    expect(server.ports).toEqual([`127.0.0.1:${port}:${port}`])
    const exposed = parseDockerfile(read('Dockerfile'))
      .at(-1)
      ?.instructions.filter((i) => i.keyword === 'EXPOSE')
      .flatMap((i) => i.args.split(/\s+/))
    expect(exposed).toContain(String(port))
    expect(proxy.volumes).toContain('./deploy/Caddyfile:/etc/caddy/Caddyfile:ro')
    expect(read('deploy/Caddyfile')).toMatch(new RegExp(`^\\s*reverse_proxy server:${port}$`, 'm'))
  })

  test('/metrics is on a listener of its own, inside the stack\'s network only; the proxy answers 404 for it', () => {
    const config = loadConfig(serverEnv)
    expect(config.metricsPort).not.toBeNull()
    expect(config.metricsPort).not.toBe(config.port)
    // Bound beyond the container's loopback, so a scraper in the network reaches it, and published nowhere.
    expect(config.metricsHost).toBe('0.0.0.0')
    const published = (service: Service) => (service.ports ?? []).map((p) => p.split(':').at(-2))
    for (const service of Object.values(compose.services)) expect(published(service)).not.toContain(String(config.metricsPort))
    const caddy = read('deploy/Caddyfile').split('\n').map((line) => line.trim())
    const refused = caddy.indexOf('respond /metrics 404')
    expect(refused).toBeGreaterThan(-1)
    expect(refused).toBeLessThan(caddy.indexOf(`reverse_proxy server:${config.port}`))
  })

  test('its health check is the image\'s', () => {
    const image = parseDockerfile(read('Dockerfile')).at(-1)?.instructions.find((i) => i.keyword === 'HEALTHCHECK')
    expect(server.healthcheck?.test).toEqual(['CMD', ...(healthcheckCommand(image?.args ?? '') ?? ['(none)'])])
  })

  test('Redis persists to a named volume and never evicts', () => {
    const args = [redis.command ?? []].flat().join(' ')
    expect(args).toContain('--appendonly yes')
    expect(args).toContain('--maxmemory-policy noeviction')
    // A named volume, declared at the top: not a bind mount, not the image's anonymous one.
    const volumeAt = (service: Service, path: string) =>
      (service.volumes ?? []).find((v) => v.endsWith(`:${path}`))?.split(':')[0] ?? `(no volume at ${path})`
    expect(Object.keys(compose.volumes)).toContain(volumeAt(redis, '/data'))
    expect(Object.keys(compose.volumes)).toContain(volumeAt(postgres, '/var/lib/postgresql/data'))
  })

  test('PostgreSQL ends a backend left idle inside a transaction after a minute', () => {
    // The case no check of a running server can reach: its machine gone with the transaction's locks.
    // The server sends no such startup parameter itself: a pooler would refuse the connection.
    expect([postgres.command ?? []].flat()).toEqual(['postgres', '-c', 'idle_in_transaction_session_timeout=60s'])
  })

  test("the server's open-files limit is set, above the one it warns of", () => {
    const nofile = server.ulimits?.nofile
    const soft = typeof nofile === 'number' ? nofile : nofile?.soft
    expect(soft).toBeGreaterThanOrEqual(LOW_FD_LIMIT)
  })

  test('the server starts once PostgreSQL and Redis are healthy; every service restarts', () => {
    expect(server.depends_on).toEqual({ postgres: { condition: 'service_healthy' }, redis: { condition: 'service_healthy' } })
    for (const name of ['postgres', 'redis']) expect(compose.services[name]?.healthcheck?.test.length).toBeGreaterThan(1)
    for (const [name, service] of Object.entries(compose.services)) expect([name, service.restart]).toEqual([name, 'unless-stopped'])
  })

  test('DATABASE_URL and REDIS_URL name the compose services with their credentials', () => {
    const { POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB } = interpolated(postgres.environment)
    const database = new URL(serverEnv.DATABASE_URL ?? '')
    expect([database.hostname, database.username, database.password, database.pathname]).toEqual([
      'postgres',
      String(POSTGRES_USER),
      String(POSTGRES_PASSWORD),
      `/${POSTGRES_DB}`,
    ])
    const store = new URL(serverEnv.REDIS_URL ?? '')
    const redisArgs = [redis.command ?? []].flat().map((arg) => interpolate(arg, dotenv))
    expect([store.hostname, store.password]).toEqual(['redis', String(redisArgs[redisArgs.indexOf('--requirepass') + 1])])
  })

  test('secrets come from .env, required, with no value committed in .env.example', () => {
    for (const secret of ['MASTER_KEY', 'POSTGRES_PASSWORD', 'REDIS_PASSWORD']) {
      expect(required).toContain(secret)
      expect([secret, example[secret]]).toEqual([secret, ''])
    }
    expect(server.environment?.MASTER_KEY).toMatch(/^\$\{MASTER_KEY:\?[^}]*\}$/)
    // Every variable compose.yml cannot start without is listed for the operator to fill in.
    for (const name of required) expect(Object.keys(example)).toContain(name)
  })

  test('.env is git-ignored and kept out of the image; .env.example is committed', () => {
    const ignored = (path: string) => Bun.spawnSync(['git', 'check-ignore', '-q', path], { cwd: ROOT }).exitCode === 0
    expect([ignored('.env'), ignored('.env.production'), ignored('.env.example')]).toEqual([true, true, false])
    expect(read('.dockerignore').split('\n')).toContain('.env')
  })

  test('TRUSTED_PROXIES trusts the proxy by its fixed address on the stack\'s network', () => {
    const address = proxy.networks?.default?.ipv4_address
    expect(serverEnv.TRUSTED_PROXIES).toBe(address)
    const [subnet] = compose.networks.default.ipam.config
    const [base, bits] = (subnet?.subnet ?? '').split('/')
    expect(bits).toBe('24')
    expect(address?.split('.').slice(0, 3)).toEqual(base?.split('.').slice(0, 3))
  })

  test('no other container can be given the proxy\'s address: dynamic ones come from a range without it', () => {
    const [config] = compose.networks.default.ipam.config
    const subnet = ipaddr.parseCIDR(config?.subnet ?? '')
    const dynamic = ipaddr.parseCIDR(config?.ip_range ?? '')
    const proxyAddress = ipaddr.parse(proxy.networks?.default?.ipv4_address ?? '')
    expect(dynamic[0].match(subnet)).toBe(true)
    expect(dynamic[1]).toBeGreaterThan(subnet[1])
    expect(proxyAddress.match(subnet)).toBe(true)
    expect(proxyAddress.match(dynamic)).toBe(false)
    // The README tells a proxy on the host to trust the gateway: it stays where the README says.
    expect(config?.gateway).toBe('172.30.53.1')
    expect(read('README.md')).toContain(`the stack network's gateway, \`${config?.gateway}\``)
  })
})
