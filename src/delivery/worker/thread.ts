/// <reference lib="webworker" />
import { TurnBatcher } from '../../lib/batcher'
import { type CancelQueued, type DispatchStart, type DispatchStop, type JobsStarted, KICK, PING, type SecretReply, type WorkerInit, type WorkerReply, type WorkerSend } from '../protocol'
import { Deliveries } from './deliveries'
import { Dispatching } from './dispatching'

/**
 * A delivery worker: sends prepared, signed POSTs so that slow or dead receivers cost the API
 * thread nothing. Started once at boot by the pool and kept for the life of the process. On
 * PostgreSQL the pool's first worker also runs the outbox dispatcher (see startDispatcher).
 */
declare var self: Worker

const deliveries = new Deliveries()
const dispatching = new Dispatching(deliveries, (msg) => self.postMessage(msg))
// Replies finished in the same turn travel back as one message, like the jobs came in.
const replies = new TurnBatcher<WorkerReply>((batch) => self.postMessage(JSON.stringify(batch)))
const starts = new TurnBatcher<number>((ids) => self.postMessage({ type: 'started', ids } satisfies JobsStarted))

type Incoming = WorkerInit | DispatchStart | DispatchStop | SecretReply | CancelQueued | string

self.onmessage = (event: MessageEvent<Incoming>) => {
  const msg = event.data
  if (typeof msg !== 'string') {
    if (msg.type === 'init') deliveries.configure(msg)
    else if (msg.type === 'dispatch') dispatching.start(msg)
    else if (msg.type === 'opened') dispatching.opened(msg)
    else if (msg.type === 'stop') dispatching.stop()
    else if (msg.type === 'cancel') deliveries.cancelQueued(msg.withdrawn && new Map(msg.withdrawn))
    return
  }
  if (msg === KICK) return dispatching.wake()
  if (msg === PING) return self.postMessage({ type: 'pong' })
  for (const { id, type: _, ...job } of JSON.parse(msg) as WorkerSend[]) {
    void deliveries.send(job, () => starts.add(id)).then((result) => replies.add({ id, ...result }))
  }
}
