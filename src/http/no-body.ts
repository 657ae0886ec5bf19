import { Elysia } from 'elysia'
import { badRequest } from '../lib/errors'

/** Requests whose body had no bytes, which reads as null like a JSON `null` (app.ts parseBody). */
const emptyBodies = new WeakSet<Request>()

/** Notes that `request` came with an empty body. */
export const sentEmptyBody = (request: Request) => emptyBodies.add(request)

/**
 * `{ noBody: true }` on a /v1 route that documents no body: the contract's strict bodies apply to it too,
 * so a field sent there is refused (400 naming it) before anything changes, instead of being ignored.
 * No body, an empty one and `{}` pass; a JSON `null` or `""` is a body, and refused.
 */
export const noBody = new Elysia({ name: 'no-body' }).macro({
  noBody: {
    beforeHandle({ body, request }: { body: unknown; request: Request }) {
      if (body === undefined || emptyBodies.has(request)) return
      if (typeof body !== 'object' || body === null || Array.isArray(body)) throw badRequest('This route takes no body')
      const [field] = Object.keys(body)
      if (field !== undefined) throw badRequest(`Unknown field ${JSON.stringify(field)}: this route takes no body`)
    },
  },
})
