import { Elysia } from 'elysia'
import type { Deps } from '../deps'

export const licenseRoutes = (deps: Deps) => new Elysia({ name: 'routes-licenses' })
