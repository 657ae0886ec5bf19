import { hmacHex } from '../lib/crypto'
import type { DeliveryJob } from './protocol'

/**
 * Builds the spec's signed POST: body { event, timestamp, data }, the four headers, HMAC of the raw
 * body. `dataJson` is the data object as JSON text (the outbox hands it over as text already).
 * AuthForge's own three headers go too (its signature the same HMAC, bare hex): a receiver written from
 * AuthForge's documentation reads those, and refused every delivery without them.
 */
export function signedDelivery(url: string, secret: string, event: string, occurredAt: Date, dataJson: string): DeliveryJob {
  const timestamp = occurredAt.toISOString()
  const body = `{"event":${JSON.stringify(event)},"timestamp":"${timestamp}","data":${dataJson}}`
  const signature = hmacHex(secret, body)
  return {
    url,
    body,
    headers: {
      'content-type': 'application/json',
      'user-agent': 'license-service-webhooks/1',
      'x-service-event': event,
      'x-service-timestamp': timestamp,
      'x-service-signature': `sha256=${signature}`,
      'x-authforge-event': event,
      'x-authforge-timestamp': timestamp,
      'x-authforge-signature': signature,
    },
  }
}
