import { Elysia } from 'elysia'
import type { Deps } from '../deps'

export const clientRoutes = (deps: Deps) => new Elysia({ name: 'routes-client' })
