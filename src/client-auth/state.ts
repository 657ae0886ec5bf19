import type { SignedPayloads } from './payload'
import type { SessionTokens } from './session'
import type { EventBatch } from './validated-events'

/** What the client endpoints keep between requests; built once by boot. */
export interface ClientAuthState {
  /** license.validated events waiting for their batched INSERT; stopped at shutdown. */
  events: EventBatch
  payloads: SignedPayloads
  sessions: SessionTokens
}
