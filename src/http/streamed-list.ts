import { and, type Column, eq, lt, lte, or, type SQL } from 'drizzle-orm'

/**
 * How many rows each read of a streamed listing takes: a listing with no bound of its own (a license's
 * offline files, an account's apps, an app's signing keys) read and encoded at once took seconds of the
 * process's time and gigabytes for a few hundred thousand rows, while every other request waited (and
 * client validates timed out their Redis call, the event loop held).
 */
export const ROWS_PER_READ = 1_000

/**
 * A listing as the JSON object `{ "<field>": [...] }`, sent in pieces of ROWS_PER_READ rows, each read
 * once the last piece went (`read` is given the last row sent, for a keyset bound), so other requests
 * are served in between and one piece is held at a time. A read that fails ends the response
 * unfinished: its JSON does not parse.
 */
export function streamedList<Row>(field: string, read: (after: Row | null) => Promise<Row[]>, view: (row: Row) => unknown): Response {
  const text = new TextEncoder()
  let after: Row | null = null
  let sent = 0
  const body = new ReadableStream<Uint8Array>({
    async pull(out) {
      const first = sent === 0 && after === null
      const rows = await read(after)
      let piece = first ? `{${JSON.stringify(field)}:[` : ''
      for (const row of rows) piece += (sent++ === 0 ? '' : ',') + JSON.stringify(view(row))
      const last = rows.at(-1)
      if (rows.length < ROWS_PER_READ || last === undefined) {
        out.enqueue(text.encode(`${piece}]}`))
        out.close()
        return
      }
      after = last
      out.enqueue(text.encode(piece))
    },
  })
  return new Response(body, { headers: { 'content-type': 'application/json' } })
}

/**
 * The keyset bound of a newest-first listing ordered by (time, id) descending: the rows after `after`.
 * The bound on the time alone is what an index on (owner, time) can start from: with the OR only, each
 * read walked the index from the newest row (a million rows: quadratic).
 */
export const olderThan = (time: Column, id: Column, after: { time: Date; id: string } | null): SQL | undefined =>
  after ? and(lte(time, after.time), or(lt(time, after.time), and(eq(time, after.time), lt(id, after.id)))) : undefined
