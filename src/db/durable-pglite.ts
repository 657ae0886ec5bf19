import fs from 'node:fs'
import { PGlite } from '@electric-sql/pglite'
import { NodeFS } from '@electric-sql/pglite/nodefs'

/** The parts of PGlite's Emscripten module that its Node file system is reached through. */
interface NodeFsModule {
  NODEFS: {
    stream_ops: { fsync?: (stream: { nfd: number }) => number }
    tryFSOperation<T>(operation: () => T): T
  }
}

/**
 * PGlite's Node file system as PostgreSQL needs it to be durable. As shipped, Emscripten's NODEFS has
 * no fsync, so a flush PostgreSQL asks for does nothing and a commit sits in the operating system's
 * cache: a crash of the machine lost the last half minute of changes, and could leave a database that
 * no longer starts. This gives it the real one (errors come back as errno values, which PostgreSQL
 * reports, instead of exceptions thrown through its stack).
 */
class DurableNodeFS extends NodeFS {
  override async init(pg: PGlite, opts: Parameters<NodeFS['init']>[1]) {
    const { emscriptenOpts } = await super.init(pg, opts)
    const preRun = [
      ...(emscriptenOpts.preRun ?? []),
      (mod: unknown) => {
        const { NODEFS } = mod as NodeFsModule
        NODEFS.stream_ops.fsync = (stream) => NODEFS.tryFSOperation(() => (fs.fsyncSync(stream.nfd), 0))
      },
    ]
    return { emscriptenOpts: { ...emscriptenOpts, preRun } }
  }
}

/**
 * PGlite starts PostgreSQL with `-F` (fsync off); without it, a commit returns once its WAL is on disk.
 * `wal_sync_method=fsync`: the build's fdatasync is a no-op that never reaches the file system, where
 * its fsync reaches DurableNodeFS.
 */
const DURABLE_START_PARAMS = [...PGlite.defaultStartParams.filter((param) => param !== '-F'), '-c', 'wal_sync_method=fsync']

/**
 * An embedded database in `dir` whose commits survive a crash of the machine; with `sharedBuffersMb`,
 * that much of shared buffers instead of PGlite's 128 MB.
 */
export const openDurablePglite = (dir: string, sharedBuffersMb?: number) =>
  new PGlite({
    fs: new DurableNodeFS(dir),
    startParams: sharedBuffersMb ? [...DURABLE_START_PARAMS, '-c', `shared_buffers=${sharedBuffersMb}MB`] : DURABLE_START_PARAMS,
  })
