/**
 * The values the OpenAPI document's examples are made of, shaped as the service makes them, so that the
 * examples of different routes tell one consistent story (one app, its license, its machines).
 */
export const EXAMPLE = {
  appId: '3f6c1a52-8e0b-4d7e-9a41-5b2f0c7d9e13',
  accountId: '789adeb7-fcae-4715-9a87-f7889261e9c2',
  appName: 'Acme Desktop',
  appSecret: 'EK93NjtXClI6FzmzYpgVhTPPUZeiZZsEynyT-1FEujQ',
  keyId: 'key_zbxz24N8jIzL',
  publicKey: 'hMTPK7Yza3FCvXrdq2Dcr7yCjPVQgOxAXgcWIaKiXPA=',
  licenseKey: 'K7QM-3XWT-9HFP-2RDN',
  hwid: 'hwid-2b81d04f',
  otherHwid: 'hwid-7f3a9c2e',
  createdAt: '2026-11-24T03:55:39.120Z',
  expiresAt: '2027-11-24T00:00:00.000Z',
  webhookId: 'wh_2fr_UNEqu9mVFZ7M',
  webhookSecret: 'whsec_1FQK4uyL7n5Y3spGKmaOUgnMtfhpXe9h',
  fileId: '254c4a62-aa47-404e-bdef-e3b12eeaeb14',
  variables: { tier: 'pro', seats: 5, beta: true },
} as const
