/**
 * Bun runs every fetch of a process, its workers' too, on one HTTP client thread, which has at most
 * BUN_CONFIG_MAX_HTTP_REQUESTS open (256 unset; read only at the process's start, so LAUNCH_ENV sets
 * it): past it a request waits inside Bun, unseen, while its timeout runs, and ends with status 0
 * though it was never sent. The deliveries and the test pings share it out so that neither waits there.
 */
export const PROCESS_FETCH_LIMIT = Math.max(2, Number(process.env.BUN_CONFIG_MAX_HTTP_REQUESTS) || 256)

/** What test pings may have open at once: the outbox's deliveries keep out of it, so a backlog to receivers that hang never holds a ping back. */
export const PING_FETCHES = Math.max(1, Math.min(32, Math.floor(PROCESS_FETCH_LIMIT / 8)))

/** What the outbox's deliveries may have open at once in a process. */
export const DELIVERY_FETCHES = PROCESS_FETCH_LIMIT - PING_FETCHES
