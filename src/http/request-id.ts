import { randomBytes } from 'node:crypto'

export const REQUEST_ID_HEADER = 'x-request-id'

/**
 * A request id taken from the client or a proxy in front: 1 to 128 of letters, digits and `-_.:`,
 * which covers UUIDs, ULIDs, nginx's $request_id and Envoy's; anything else (spaces, quotes, control
 * characters, a header long enough to bloat every line) is replaced rather than logged.
 */
const SANE_ID = /^[A-Za-z0-9_.:-]{1,128}$/

// A random prefix per process and a counter: unique across processes and restarts without the cost
// of a UUID per request. Ids name requests in logs; they are not secrets and need not be unguessable.
const prefix = randomBytes(6).toString('hex')
let counter = 0

/** The id the request brought when it is sane, else a new one. */
export function requestIdFor(request: Request): string {
  const given = request.headers.get(REQUEST_ID_HEADER)
  if (given !== null && SANE_ID.test(given)) return given
  counter = (counter + 1) % Number.MAX_SAFE_INTEGER
  return `${prefix}-${counter.toString(36)}`
}
