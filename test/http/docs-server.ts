import { makeTestApp } from '../support/helpers'

/** A test app listening on a free local port, for clients that need a real server (a linter, a browser). */
export async function listeningApp(): Promise<{ origin: string; stop(): Promise<void> }> {
  const { app } = await makeTestApp()
  app.listen({ hostname: '127.0.0.1', port: 0 })
  return {
    origin: `http://127.0.0.1:${app.server!.port}`,
    async stop() {
      await app.stop()
    },
  }
}
