import { Elysia } from 'elysia'
import type { Deps } from '../deps'

export const opsRoutes = (deps: Deps) =>
  new Elysia({ name: 'routes-ops' }).get('/healthz', () => ({ ok: true }))
