/// <reference lib="webworker" />
import type { KeyObject } from 'node:crypto'
import { privateKeyFromPkcs8, signText } from '../lib/crypto'
import type { SignerMessage } from './signer'

/** The signing worker of signer.ts: holds KeyObjects by key id and signs batches in order. */
declare var self: Worker

const keys = new Map<string, KeyObject>()

self.onmessage = (event: MessageEvent<SignerMessage>) => {
  const msg = event.data
  switch (msg.type) {
    case 'key':
      // A key that does not open is not kept: its texts are answered null, and signed (or failed) by the
      // main thread, each alone; thrown here, it ended the worker and every batch it held.
      try {
        keys.set(msg.keyId, privateKeyFromPkcs8(Buffer.from(msg.pkcs8)))
      } catch {
        keys.delete(msg.keyId)
      }
      return
    case 'forget':
      keys.clear()
      return
    case 'sign': {
      const signatures = msg.texts.map((text, i) => {
        const key = keys.get(msg.keyIds[i] as string)
        try {
          return key ? signText(text, key) : null
        } catch {
          return null
        }
      })
      self.postMessage(signatures)
    }
  }
}
