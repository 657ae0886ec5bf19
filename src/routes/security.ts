import { Elysia } from 'elysia'
import type { Deps } from '../deps'

export const securityRoutes = (deps: Deps) => new Elysia({ name: 'routes-security' })
