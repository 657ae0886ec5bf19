/**
 * The service's settings (README's Settings) that say where it runs and on what: test/setup.ts drops
 * them from the environment of every test run. LOG_LEVEL and WEBHOOK_ALLOW_PRIVATE_TARGETS stay (the
 * setup gives them defaults of its own), and so does NODE_EXTRA_CA_CERTS, which is Node's and Bun's too.
 */
export const SERVICE_SETTINGS = [
  'HOST',
  'PORT',
  'SERVER_PROCESSES',
  'DATABASE_URL',
  'DATA_DIR',
  'REDIS_URL',
  'REDIS_CLUSTER',
  'REDIS_CLUSTER_SHARDS',
  'MASTER_KEY',
  'TRUSTED_PROXIES',
  'SANDBOX_DAILY_CEILING',
  'VALIDATE_LIMIT_PER_IP',
  'VALIDATE_LIMIT_PER_LICENSE',
  'SELFBAN_LIMIT_PER_IP',
  'SELFBAN_LIMIT_PER_LICENSE',
  'CACHE_MAX_MB',
  'CACHE_WARM_UP',
  'PUBLIC_RATE_LIMITS',
  'SESSION_TTL_SECONDS',
  'TLS_CERT_FILE',
  'TLS_KEY_FILE',
  'METRICS_PORT',
  'METRICS_HOST',
] as const
