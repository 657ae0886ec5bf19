import { createPrivateKey, X509Certificate } from 'node:crypto'
import { existsSync, readFileSync } from 'node:fs'
import { isIP } from 'node:net'
import { availableParallelism, totalmem } from 'node:os'
import { type Cidr, parseCidr } from './lib/ip'

/** Every setting the server and the CLI read, parsed once from the environment. */
export interface Config {
  host: string
  port: number
  /**
   * Server processes sharing the listener (SO_REUSEPORT): 1, or more on a machine with as many cores;
   * more than 1 needs DATABASE_URL and REDIS_URL, the state every instance shares, and with both set
   * it is one per core, at most DEFAULT_PROCESSES_CAP, unless SERVER_PROCESSES says otherwise.
   */
  serverProcesses: number
  /** postgres://… or null for the embedded PGlite under dataDir. */
  databaseUrl: string | null
  dataDir: string
  /** redis://… or null for the in-process store; with redisClusterShards, the cluster's seed nodes, comma-separated. */
  redisUrl: string | null
  /** REDIS_CLUSTER: the shards (hash tags) the accounts are spread over on a Redis Cluster; null: not a cluster. */
  redisClusterShards: number | null
  trustedProxies: readonly Cidr[]
  webhookAllowPrivateTargets: boolean
  /** NODE_EXTRA_CA_CERTS: also handed to webhook deliveries explicitly, so in-process tests can trust a CA. */
  webhookExtraCaFile: string | null
  sandboxDailyCeiling: number
  validateLimitPerIp: number
  validateLimitPerLicense: number
  selfbanLimitPerIp: number
  selfbanLimitPerLicense: number
  /** CACHE_MAX_MB: what the cached app entries (as estimated) and license records (exactly) may hold (the process uses more: code, pools, buffers). */
  cacheMaxMb: number
  /** CACHE_WARM_UP: the server fills the license cache from PostgreSQL at start (actors/warm-up.ts). */
  cacheWarmUp: boolean
  /** false skips the per-IP and per-license buckets of /auth/* (benchmark comparison only; the sandbox ceiling stays). */
  publicRateLimits: boolean
  sessionTtlSeconds: number
  /** STALL_EXIT_SECONDS: a server process whose main thread runs no JavaScript this long ends itself (0: never). */
  stallExitSeconds: number
  tlsCertFile: string | null
  tlsKeyFile: string | null
  /** 32-byte key that encrypts signing keys and webhook secrets at rest; null: a dev key in dataDir. */
  masterKey: Buffer | null
  logLevel: 'debug' | 'info' | 'warn' | 'error'
  /** METRICS_PORT: a listener of its own for /metrics (then 404 on PORT); null: /metrics on PORT. */
  metricsPort: number | null
  /** METRICS_HOST: the address that listener binds, loopback unless told otherwise. */
  metricsHost: string
}

export class ConfigError extends Error {}

type Env = Record<string, string | undefined>

function str(env: Env, name: string, fallback: string): string {
  const v = env[name]
  return v === undefined || v === '' ? fallback : v
}

function optional(env: Env, name: string): string | null {
  const v = env[name]
  return v === undefined || v === '' ? null : v
}

function int(env: Env, name: string, fallback: number, min: number, max: number): number {
  const raw = env[name]
  if (raw === undefined || raw === '') return fallback
  if (!/^\d+$/.test(raw.trim())) throw new ConfigError(`${name} must be a whole number, got "${raw}"`)
  const n = Number(raw.trim())
  if (n < min || n > max) throw new ConfigError(`${name} must be between ${min} and ${max}, got ${n}`)
  return n
}

function bool(env: Env, name: string, fallback: boolean): boolean {
  const raw = env[name]
  if (raw === undefined || raw === '') return fallback
  const v = raw.trim().toLowerCase()
  if (['true', '1', 'yes'].includes(v)) return true
  if (['false', '0', 'no'].includes(v)) return false
  throw new ConfigError(`${name} must be true or false, got "${raw}"`)
}

function url(env: Env, name: string, protocols: string[]): string | null {
  const raw = optional(env, name)
  if (raw === null) return null
  let parsed: URL
  try {
    parsed = new URL(raw)
  } catch {
    throw new ConfigError(`${name} is not a valid URL`)
  }
  if (!protocols.includes(parsed.protocol)) {
    throw new ConfigError(`${name} must start with ${protocols.map((p) => `${p}//`).join(' or ')}`)
  }
  // The drivers decode them at connect time, where a URIError stopped the start with a stack trace.
  try {
    decodeURIComponent(parsed.username)
    decodeURIComponent(parsed.password)
  } catch {
    throw new ConfigError(`${name}'s user name or password has a "%" that is not an escape: write "%" as %25`)
  }
  return raw
}

/** The application_name of the connections that serve requests or deliveries. */
export const SERVER_CONNECTION_NAME = 'license-service'

/**
 * DATABASE_URL. The service names its connections itself: `master-key rotate` finds running servers
 * by that name in pg_stat_activity, and the driver lets a name in the URL replace it, so a server
 * started with one went unseen and the rotation re-sealed under it.
 */
function databaseSetting(env: Env): string | null {
  const raw = url(env, 'DATABASE_URL', ['postgres:', 'postgresql:'])
  if (raw === null) return null
  // PostgreSQL reads a startup parameter's name in any case, and the last of one name wins.
  const named = [...new URL(raw).searchParams].some(
    ([name, value]) => name.toLowerCase() === 'application_name' || (name.toLowerCase() === 'options' && /application_name/i.test(value)),
  )
  if (named) {
    throw new ConfigError(
      `DATABASE_URL sets application_name: the service names its connections ${SERVER_CONNECTION_NAME} (master-key rotate finds running servers by it); remove it`,
    )
  }
  return raw
}

/**
 * REDIS_URL, or with REDIS_CLUSTER=true the seed nodes of a cluster (one or more URLs, comma-separated;
 * credentials and TLS from the first). A cluster has database 0 only.
 */
function redisSettings(env: Env): Pick<Config, 'redisUrl' | 'redisClusterShards'> {
  const cluster = bool(env, 'REDIS_CLUSTER', false)
  // At least 2: one shard means untagged keys (the single Redis's names), which a cluster scatters over slots.
  // Checked when unused too (no cluster, no Redis): a typo in a setting waiting for the cluster is found now, not at the switch.
  const shards = int(env, 'REDIS_CLUSTER_SHARDS', 64, 2, 16_384)
  const raw = optional(env, 'REDIS_URL')
  if (raw === null) {
    if (cluster) throw new ConfigError('REDIS_CLUSTER=true needs REDIS_URL naming one or more of the cluster\'s nodes')
    return { redisUrl: null, redisClusterShards: null }
  }
  const nodes = raw.split(',').map((u) => u.trim())
  if (nodes.length > 1 && !cluster) {
    throw new ConfigError('REDIS_URL names several nodes: set REDIS_CLUSTER=true for a Redis Cluster, or name one Redis')
  }
  for (const node of nodes) {
    if (node === '') throw new ConfigError('REDIS_URL has an empty entry between commas')
    const { pathname } = new URL(url({ REDIS_URL: node }, 'REDIS_URL', ['redis:', 'rediss:']) as string)
    // The path is the database number: ioredis reads anything else as database 0, where other data lives.
    // Not quoted: a password with an unencoded "/" is read as the path, and would be printed.
    if (!/^(\/\d*)?$/.test(pathname)) throw new ConfigError(`REDIS_URL's path must be a database number (percent-encode "/", "?", "#" and "@" in a password)`)
    if (cluster && !['', '/', '/0'].includes(pathname)) {
      throw new ConfigError(`REDIS_URL names database ${pathname.slice(1)}: a Redis Cluster has database 0 only`)
    }
  }
  return { redisUrl: nodes.join(','), redisClusterShards: cluster ? shards : null }
}

/** A 32-byte key from the variable `name` (MASTER_KEY; the CLI's NEW_MASTER_KEY when rotating); null when unset. */
export function masterKeyFrom(env: Env, name: string): Buffer | null {
  const raw = optional(env, name)
  if (raw === null) return null
  // Base64 decoding skips what is not base64: a stray quote or typo would read as another key.
  const key = /^[0-9a-fA-F]{64}$/.test(raw) ? Buffer.from(raw, 'hex') : /^[A-Za-z0-9+/_-]{43}=?$/.test(raw) ? Buffer.from(raw, 'base64') : null
  if (key?.length !== 32) throw new ConfigError(`${name} must be 32 bytes, as 64 hex characters or base64`)
  return key
}

/**
 * What `parse` (which throws on anything else) reads as `what` from the PEM file setting `name` names;
 * a ConfigError naming the setting otherwise.
 */
function pemFile<T>(name: string, file: string, what: string, parse: (pem: string) => T): T {
  if (!existsSync(file)) throw new ConfigError(`${name} names a file that does not exist: "${file}"`)
  let pem: string
  try {
    pem = readFileSync(file, 'utf8')
  } catch (err) {
    throw new ConfigError(`${name} names a file that cannot be read: "${file}" (${(err as { code?: string }).code ?? 'unreadable'})`)
  }
  try {
    return parse(pem)
  } catch {
    throw new ConfigError(`${name} names a file that is not a PEM ${what}: "${file}"`)
  }
}

function hostSetting(env: Env, name: string, fallback: string): string {
  const host = str(env, name, fallback)
  if (isIP(host) === 0 && !/^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$/.test(host)) {
    throw new ConfigError(`${name} must be an IP address or a host name, got "${host}"`)
  }
  return host
}

/**
 * CACHE_MAX_MB unset: this share of the memory the server may use, split among its processes, so a
 * host or container with room for its licenses holds them all (a million take ~190 MB) and a small
 * one is not pushed past its memory by the default; never below MIN_DEFAULT_CACHE_MB.
 */
const DEFAULT_CACHE_SHARE = 1 / 8
const MIN_DEFAULT_CACHE_MB = 32
/**
 * The most CACHE_MAX_MB gives, set or not: a process holds its license records in one arena, which one
 * ArrayBuffer of at most 2 GiB backs (license-cache.ts). Past it the cache held no more, and the
 * warm-up, filling toward the setting, read the whole licenses table while evicting what it had read.
 */
export const CACHE_MAX_MB_CEILING = 2048

/**
 * The memory this process may use, in MB: its cgroup's limit in a container (process.constrainedMemory
 * reads it: Bun the lower of memory.high and memory.max, the machine's memory without one; some Node
 * versions answer 0 or a huge number then), else the machine's.
 */
export function usableMemoryMb(): number {
  const machine = totalmem()
  const constrained = process.constrainedMemory?.() ?? 0
  return Math.floor((constrained > 0 ? Math.min(constrained, machine) : machine) / 2 ** 20)
}

export const defaultCacheMb = (memoryMb: number, processes: number): number =>
  Math.min(CACHE_MAX_MB_CEILING, Math.max(MIN_DEFAULT_CACHE_MB, Math.floor((memoryMb * DEFAULT_CACHE_SHARE) / processes)))

/** Server processes a shared-store server runs when SERVER_PROCESSES is unset, at most. */
export const DEFAULT_PROCESSES_CAP = 4

export function loadConfig(env: Env = process.env): Readonly<Config> {
  const proxies = str(env, 'TRUSTED_PROXIES', '')
    .split(',')
    .map((p) => p.trim())
    .filter(Boolean)
    .map((p) => {
      const cidr = parseCidr(p)
      if (!cidr) throw new ConfigError(`TRUSTED_PROXIES has an entry that is not an IP or CIDR: "${p}"`)
      return cidr
    })
  const tlsCertFile = optional(env, 'TLS_CERT_FILE')
  const tlsKeyFile = optional(env, 'TLS_KEY_FILE')
  if ((tlsCertFile === null) !== (tlsKeyFile === null)) {
    throw new ConfigError('TLS_CERT_FILE and TLS_KEY_FILE must be set together')
  }
  // A file that is missing, unreadable or not PEM is a setting error: say so before start-up, not as a
  // stack trace from listen once the database is migrated.
  if (tlsCertFile !== null && tlsKeyFile !== null) {
    const certificate = pemFile('TLS_CERT_FILE', tlsCertFile, 'certificate', (pem) => new X509Certificate(pem))
    const key = pemFile('TLS_KEY_FILE', tlsKeyFile, 'private key', (pem) => createPrivateKey(pem))
    if (!certificate.checkPrivateKey(key)) {
      throw new ConfigError(`TLS_KEY_FILE is not the private key of the certificate in TLS_CERT_FILE: "${tlsKeyFile}"`)
    }
  }
  const extraCaFile = optional(env, 'NODE_EXTRA_CA_CERTS')
  // Read only by webhook deliveries, which would fail one by one (status 0) long after start-up.
  if (extraCaFile !== null) pemFile('NODE_EXTRA_CA_CERTS', extraCaFile, 'certificate', (pem) => new X509Certificate(pem))
  const host = hostSetting(env, 'HOST', '0.0.0.0')
  const metricsHost = hostSetting(env, 'METRICS_HOST', '127.0.0.1')
  const port = int(env, 'PORT', 3000, 0, 65535)
  const metricsPort = optional(env, 'METRICS_PORT') === null ? null : int(env, 'METRICS_PORT', 0, 1, 65535)
  if (metricsPort !== null && metricsPort === port) {
    throw new ConfigError(`METRICS_PORT must differ from PORT (${port}): it opens a listener of its own`)
  }
  const databaseUrl = databaseSetting(env)
  const { redisUrl, redisClusterShards } = redisSettings(env)
  // Unset, a server with the shared database and store runs one process per core, up to
  // DEFAULT_PROCESSES_CAP: one Bun process serves HTTP on one thread, and the second core would otherwise
  // only sign; the cap keeps a large host (or a container whose CPU quota the core count does not show)
  // from opening a pool and a cache per core by default. Without them, one.
  const shared = databaseUrl !== null && redisUrl !== null
  const processesSetting = str(env, 'SERVER_PROCESSES', '').trim()
  const serverProcesses =
    processesSetting === 'auto'
      ? availableParallelism()
      : processesSetting === ''
        ? shared
          ? Math.min(availableParallelism(), DEFAULT_PROCESSES_CAP)
          : 1
        : int(env, 'SERVER_PROCESSES', 1, 1, 256)
  if (serverProcesses > 1 && !shared) {
    throw new ConfigError('SERVER_PROCESSES above 1 needs DATABASE_URL and REDIS_URL: the embedded database and store belong to one process')
  }
  const logLevel = str(env, 'LOG_LEVEL', 'info')
  if (!['debug', 'info', 'warn', 'error'].includes(logLevel)) {
    throw new ConfigError(`LOG_LEVEL must be debug, info, warn or error, got "${logLevel}"`)
  }
  return Object.freeze({
    host,
    port,
    serverProcesses,
    databaseUrl,
    dataDir: str(env, 'DATA_DIR', './data'),
    redisUrl,
    redisClusterShards,
    trustedProxies: Object.freeze(proxies),
    webhookAllowPrivateTargets: bool(env, 'WEBHOOK_ALLOW_PRIVATE_TARGETS', false),
    webhookExtraCaFile: extraCaFile,
    sandboxDailyCeiling: int(env, 'SANDBOX_DAILY_CEILING', 50_000, 1, 1e12),
    validateLimitPerIp: int(env, 'VALIDATE_LIMIT_PER_IP', 300, 1, 1e9),
    validateLimitPerLicense: int(env, 'VALIDATE_LIMIT_PER_LICENSE', 300, 1, 1e9),
    selfbanLimitPerIp: int(env, 'SELFBAN_LIMIT_PER_IP', 60, 1, 1e9),
    selfbanLimitPerLicense: int(env, 'SELFBAN_LIMIT_PER_LICENSE', 60, 1, 1e9),
    publicRateLimits: bool(env, 'PUBLIC_RATE_LIMITS', true),
    cacheMaxMb: Math.min(CACHE_MAX_MB_CEILING, int(env, 'CACHE_MAX_MB', defaultCacheMb(usableMemoryMb(), serverProcesses), 1, 1_048_576)),
    cacheWarmUp: bool(env, 'CACHE_WARM_UP', true),
    sessionTtlSeconds: int(env, 'SESSION_TTL_SECONDS', 86_400, 3600, 604_800),
    stallExitSeconds: int(env, 'STALL_EXIT_SECONDS', 60, 0, 86_400),
    tlsCertFile,
    tlsKeyFile,
    masterKey: masterKeyFrom(env, 'MASTER_KEY'),
    logLevel: logLevel as Config['logLevel'],
    metricsPort,
    metricsHost,
  })
}
