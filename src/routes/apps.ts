import { Elysia } from 'elysia'
import type { Deps } from '../deps'

export const appRoutes = (deps: Deps) => new Elysia({ name: 'routes-apps' })
