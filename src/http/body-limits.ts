/** Body limits from the contract: 16 KiB on the client endpoints, 1 MiB on the Developer API. */
export const AUTH_BODY_LIMIT = 16 * 1024
export const API_BODY_LIMIT = 1024 * 1024

/**
 * How long a whole body may take to arrive, in ms, before it is answered 408 in the route's shape. Past
 * Elysia's idle timeout (30 s, not restarted by the body's bytes) Bun closes the connection without a
 * word, so both stay under it. A client endpoint's body is a few hundred bytes, and its SDK gives up
 * sooner; a Developer API body of 1 MiB arrives within 20 s over a link of 50 KB/s.
 */
export const BODY_DEADLINES = { auth: 10_000, api: 20_000 }

/** The 408's message for a body still arriving at `deadlineMs` (the Developer API's; the client endpoints' have none). */
export const bodyTooSlow = (deadlineMs: number) => `Request body did not arrive within ${deadlineMs / 1000} s`
