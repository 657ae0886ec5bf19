import { Elysia } from 'elysia'
import { badRequest } from '../lib/errors'

/**
 * `{ noBody: true }` on a /v1 route that documents no body: the contract's strict bodies apply to it too,
 * so a field sent there is refused (400 naming it) before anything changes, instead of being ignored.
 * No body, an empty one and `{}` pass.
 */
export const noBody = new Elysia({ name: 'no-body' }).macro({
  noBody: {
    beforeHandle({ body }: { body: unknown }) {
      // An empty body reads as null (app.ts parseBody).
      if (body === undefined || body === null || body === '') return
      if (typeof body !== 'object' || body === null || Array.isArray(body)) throw badRequest('This route takes no body')
      const [field] = Object.keys(body)
      if (field !== undefined) throw badRequest(`Unknown field ${JSON.stringify(field)}: this route takes no body`)
    },
  },
})
