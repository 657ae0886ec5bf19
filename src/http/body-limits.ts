/** Body limits from the contract: 16 KiB on the client endpoints, 1 MiB on the Developer API. */
export const AUTH_BODY_LIMIT = 16 * 1024
export const API_BODY_LIMIT = 1024 * 1024

/**
 * How long a whole body may take to arrive, in ms. Bun's idle timeout restarts at every byte, so without
 * it a client sending one byte every few seconds holds its connection and its request open for hours. A
 * client endpoint's body is a few hundred bytes; a Developer API body of 1 MiB arrives within a minute
 * over a link of 20 KB/s.
 */
export const BODY_DEADLINES = { auth: 10_000, api: 60_000 }
