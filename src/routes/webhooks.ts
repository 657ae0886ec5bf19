import { Elysia } from 'elysia'
import type { Deps } from '../deps'

export const webhookRoutes = (deps: Deps) => new Elysia({ name: 'routes-webhooks' })
