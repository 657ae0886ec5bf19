import { Elysia } from 'elysia'
import type { Deps } from '../deps'

export const docsRoutes = (deps: Deps) => new Elysia({ name: 'routes-docs' })
