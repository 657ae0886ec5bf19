/**
 * The container's health probe (the Dockerfile's HEALTHCHECK and compose.yml's): GET /healthz on this
 * server's own listener. It reads HOST, PORT and TLS from the settings the server reads, so a changed
 * setting cannot leave the probe knocking on another port or speaking HTTP to an HTTPS listener.
 * Exits 0 on a 200, 1 otherwise.
 */
import { isIP } from 'node:net'
import { ConfigError, loadConfig } from './config'

// Below the HEALTHCHECK's own timeout (5 s), so a hung server is reported by this probe's exit code.
const PROBE_TIMEOUT_MS = 4000

/** The address to reach a listener on `host` from inside its own container: a wildcard is not one to connect to. */
function reachable(host: string): string {
  if (host === '0.0.0.0') return '127.0.0.1'
  if (host === '::') return '[::1]'
  return isIP(host) === 6 ? `[${host}]` : host
}

/** Why the server is not healthy, or null when /healthz answers 200. */
async function unhealthy(): Promise<string | null> {
  const config = loadConfig()
  const scheme = config.tlsCertFile ? 'https' : 'http'
  // The certificate names the public host, not the address probed here: it is not checked.
  const response = await fetch(`${scheme}://${reachable(config.host)}:${config.port}/healthz`, {
    tls: { rejectUnauthorized: false },
    signal: AbortSignal.timeout(PROBE_TIMEOUT_MS),
  })
  return response.ok ? null : `/healthz answered ${response.status}`
}

// Docker keeps the probe's output with the health status: one line saying why.
const reason = await unhealthy().catch((err: unknown) =>
  err instanceof ConfigError ? `configuration error: ${err.message}` : String((err as Error)?.message ?? err),
)
if (reason !== null) process.stderr.write(`unhealthy: ${reason}\n`)
process.exit(reason === null ? 0 : 1)
