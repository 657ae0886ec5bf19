/**
 * Collects what one turn of the event loop adds and hands it over in one call: a message, a store
 * round trip or a worker post per turn instead of one per request. A microtask, not setImmediate:
 * Bun runs immediates late enough to leave the CPU idle under load.
 *
 * With `oneInFlight`, `send` returns a promise and the next batch waits for it to settle, so items
 * added meanwhile travel together in the following call (a pipeline of one, like the store's
 * authorize script, where a second call would only queue behind the first anyway). There the next
 * call does go one turn of the event loop after a call settles, the turn in which the settled call's
 * callers are answered: the store then idles while they are, but the requests read in that turn join
 * the call, and a loaded server makes fewer, larger calls (`npm run bench`: ~12 requests an authorize
 * call against ~7). An item added once that turn has passed, with nothing in flight, still goes in a
 * microtask. `send` answers its items' callers itself, a send that throws too.
 */
export class TurnBatcher<T> {
  #items: T[] = []
  #inFlight = false

  constructor(
    private readonly send: (items: T[]) => void | Promise<unknown>,
    private readonly options: { oneInFlight?: boolean } = {},
  ) {}

  add(item: T): void {
    if (this.#items.push(item) === 1 && !this.#inFlight) queueMicrotask(this.#flush)
  }

  readonly #flush = (): void => {
    const items = this.#items
    if (items.length === 0 || this.#inFlight) return
    this.#items = []
    if (!this.options.oneInFlight) {
      void this.send(items)
      return
    }
    this.#inFlight = true
    const settled = () => {
      setImmediate(() => {
        this.#inFlight = false
        this.#flush()
      })
    }
    // A send that fails must not wedge the batcher: its callers learn of the error through whatever
    // `send` promised them; the batcher only needs to know the call is over.
    let call: unknown
    try {
      call = this.send(items)
    } catch {
      settled()
      return
    }
    Promise.resolve(call).then(settled, settled)
  }
}
