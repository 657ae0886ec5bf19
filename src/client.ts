/**
 * The typed Developer API client, published as the package entry `license-service/client`.
 *
 * Only the server's type crosses over (`import type`): a program that uses this module loads Eden
 * Treaty and nothing of the server, and its calls are checked at compile time against the very routes
 * and schemas the server validates with.
 */
import { treaty } from '@elysiajs/eden'
import type { App } from './app'

export type { App }

/**
 * A Developer API client for a server at `baseUrl` (`https://licenses.example.com`), sending
 * `Authorization: Bearer <apiKey>` on every call. Paths are properties, path parameters calls:
 *
 * ```ts
 * const api = developerApi('http://localhost:3000', process.env.API_KEY!)
 * const { data, error } = await api.v1.licenses({ licenseKey: 'K7QM-3XWT-9HFP-2RDN' }).get()
 * if (error) console.error(error.status, error.value) // e.g. 404 { error: 'not_found', message }
 * else console.log(data.status, data.hwidList)
 * ```
 */
export function developerApi(baseUrl: string, apiKey: string) {
  return treaty<App>(baseUrl, { headers: { authorization: `Bearer ${apiKey}` } })
}

/** The client `developerApi` returns, for annotating variables and parameters. */
export type DeveloperApi = ReturnType<typeof developerApi>
