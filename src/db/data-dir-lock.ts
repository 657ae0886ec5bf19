/**
 * One process at a time owns a DATA_DIR whose state no other process can reach: the embedded
 * database, and the operator socket of a server without a shared store. A second server there would
 * open the same database files and take over the socket; a CLI writing directly beside a running
 * server would write what that server never sees.
 *
 * Bun has no flock: the lock is a file created atomically (a hard link of a complete temp file, so
 * nobody reads it half-written) that records its holder's pid and the process's start time. A
 * holder that died (kill -9 leaves the file) is recognised by its pid being gone, or reused by a
 * younger process, and its lock is taken over.
 *
 * Pids mean nothing across pid namespaces (a second container on the same volume) or boots: the lock
 * records both, and a holder from another one is judged by its lease instead (the holder renews the
 * lock file's modification time every second; one not renewed for LEASE_MS is a holder gone) or by
 * the operator socket it serves. The socket alone would not do: a CLI working on the storage serves
 * none, and a stopping server closes its socket before its database.
 */
import { linkSync, readFileSync, readlinkSync, rmSync, statSync, unlinkSync, utimesSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { ConfigError } from '../config'
import { operatorSocketAnswers, operatorSocketPath } from './operator-socket'
import { makeDataDir } from './data-dir'

export type LockOwner = 'server' | 'cli'

/** Who holds a DATA_DIR. */
export interface LockHolder {
  pid: number
  /** The process's start time from /proc, so a reused pid is not mistaken for the holder; null where unknown. */
  started: string | null
  owner: LockOwner
  /** /proc/self/ns/pid of the holder ("pid:[4026531836]"); null where unknown (or a lock of an older version). */
  pidNamespace: string | null
  /** The kernel's boot id when the lock was taken; null where unknown. */
  bootId: string | null
}

export interface DataDirLock {
  /** Removes the lock if it is still this process's; also runs at process exit. */
  release(): void
}

const LOCK_FILE = 'lock'
/** How often a holder renews its lease, and how long one not renewed counts as its holder's. */
const LEASE_RENEW_MS = 1_000
const LEASE_MS = 5_000
// Held only for the instant of replacing a dead holder's lock, so two processes never both do it.
const TAKEOVER_FILE = 'lock.takeover'

/** The fields of /proc/<pid>/stat after the command name (which may itself hold spaces and parentheses); null without /proc. */
function procStat(pid: number): string[] | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  } catch {
    return null
  }
}

/** Start time in clock ticks since boot (field 22 of /proc/<pid>/stat); null without /proc. */
const startTime = (pid: number): string | null => procStat(pid)?.[19] ?? null

function readOrNull(read: () => string): string | null {
  try {
    return read().trim()
  } catch {
    return null
  }
}

const HERE = {
  pidNamespace: readOrNull(() => readlinkSync('/proc/self/ns/pid')),
  bootId: readOrNull(() => readFileSync('/proc/sys/kernel/random/boot_id', 'utf8')),
}

const differs = (theirs: string | null, ours: string | null) => theirs !== null && ours !== null && theirs !== ours

/** A holder from another pid namespace or boot, whose pid is not ours to look up. */
export const isForeign = (holder: LockHolder) => differs(holder.pidNamespace, HERE.pidNamespace) || differs(holder.bootId, HERE.bootId)

/** Whether the holder is stopped (SIGSTOP, a debugger): it answers nothing until someone continues it. */
export const isStopped = (holder: LockHolder) => !isForeign(holder) && ['T', 't'].includes(procStat(holder.pid)?.[0] ?? '')

/** Whether the lease of the lock file at `path` was renewed within LEASE_MS. */
function leaseHeld(path: string): boolean {
  const modified = statSync(path, { throwIfNoEntry: false })?.mtimeMs
  return modified !== undefined && Date.now() - modified < LEASE_MS
}

async function alive(dataDir: string, holder: LockHolder, path: string): Promise<boolean> {
  // A holder that died (a container restarted after a crash) renews no lease, and left a socket file
  // nobody listens on, or none.
  if (isForeign(holder)) return leaseHeld(path) || operatorSocketAnswers(operatorSocketPath(dataDir))
  try {
    process.kill(holder.pid, 0)
  } catch (err) {
    // EPERM: the process exists under another user.
    if ((err as NodeJS.ErrnoException).code !== 'EPERM') return false
  }
  const stat = procStat(holder.pid)
  // A holder killed but not yet reaped by its parent still answers kill(pid, 0).
  if (stat?.[0] === 'Z' || stat?.[0] === 'X') return false
  // A restarted container runs its server as pid 1 again: only the start time tells the two apart.
  const started = stat?.[19] ?? null
  return holder.started === null || started === null || started === holder.started
}

function readHolder(path: string): LockHolder | null {
  let text: string
  try {
    text = readFileSync(path, 'utf8')
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null
    throw err
  }
  let parsed: Partial<LockHolder> = {}
  try {
    parsed = JSON.parse(text) as Partial<LockHolder>
  } catch {}
  if (!Number.isSafeInteger(parsed.pid) || (parsed.pid ?? 0) <= 0) {
    throw new ConfigError(`${path} is not a lock this service wrote; remove it if no server or CLI uses this DATA_DIR`)
  }
  return {
    pid: parsed.pid ?? 0,
    started: parsed.started ?? null,
    owner: parsed.owner === 'cli' ? 'cli' : 'server',
    pidNamespace: parsed.pidNamespace ?? null,
    bootId: parsed.bootId ?? null,
  }
}

/** Creates `path` holding `holder`, or returns false when it exists. */
function create(path: string, holder: LockHolder): boolean {
  const temp = `${path}.${process.pid}.${Math.random().toString(36).slice(2)}`
  try {
    // Inside the try: a write that fails (a full disk) leaves an empty file behind it, which goes too.
    writeFileSync(temp, JSON.stringify(holder), { mode: 0o600 })
    linkSync(temp, path)
    return true
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') return false
    throw err
  } finally {
    rmSync(temp, { force: true })
  }
}

/** Renews `me`'s lease on the lock at `path`, if it is still `me`'s; a failure waits for the next renewal. */
function renewLease(path: string, me: LockHolder): void {
  try {
    if (!sameHolder(readHolder(path), me)) return
    const now = new Date()
    utimesSync(path, now, now)
  } catch {}
}

const sameHolder = (a: LockHolder | null, b: LockHolder) =>
  a !== null && a.pid === b.pid && a.started === b.started && a.pidNamespace === b.pidNamespace

function removeIfHeldBy(path: string, holder: LockHolder): void {
  if (sameHolder(readHolder(path), holder)) unlinkSync(path)
}

/**
 * Removes a dead holder's lock; while another live process is doing the same, returns that process
 * (it is about to hold the lock).
 */
async function takeOver(dataDir: string, dead: LockHolder, me: LockHolder): Promise<LockHolder | null> {
  const guard = join(dataDir, TAKEOVER_FILE)
  if (!create(guard, me)) {
    const other = readHolder(guard)
    if (other && (await alive(dataDir, other, guard))) return other
    // A process that died between creating the guard and removing it would block every start.
    if (other) removeIfHeldBy(guard, other)
    return null
  }
  try {
    // Re-read under the guard: a live process may have taken the lock since it was found dead.
    removeIfHeldBy(join(dataDir, LOCK_FILE), dead)
  } finally {
    unlinkSync(guard)
  }
  return null
}

/**
 * Takes the DATA_DIR lock for this process, or returns the live process that holds it. A lock left
 * by a dead process is taken over.
 */
export async function tryLockDataDir(dataDir: string, owner: LockOwner): Promise<DataDirLock | LockHolder> {
  makeDataDir(dataDir)
  const path = join(dataDir, LOCK_FILE)
  const me: LockHolder = { pid: process.pid, started: startTime(process.pid), owner, ...HERE }
  for (;;) {
    if (create(path, me)) break
    const holder = readHolder(path)
    // Gone since the create failed: try again.
    if (holder === null) continue
    if (await alive(dataDir, holder, path)) return holder
    const other = await takeOver(dataDir, holder, me)
    if (other) return other
  }
  let held = true
  const lease = setInterval(() => renewLease(path, me), LEASE_RENEW_MS)
  lease.unref()
  const release = () => {
    if (!held) return
    held = false
    clearInterval(lease)
    process.off('exit', release)
    removeIfHeldBy(path, me)
  }
  process.on('exit', release)
  return { release }
}

export const isLock = (result: DataDirLock | LockHolder): result is DataDirLock => 'release' in result

/**
 * The one line a process prints when it cannot have the DATA_DIR: a server that holds it does not let go,
 * a CLI that held it past LOCK_WAIT_MS is stuck or running long.
 */
export const describeHolder = (dataDir: string, holder: LockHolder) =>
  holder.owner === 'server'
    ? `DATA_DIR ${dataDir} is in use by a running server (pid ${holder.pid})`
    : `DATA_DIR ${dataDir} has been in use by a running operator CLI (pid ${holder.pid}) for more than ${LOCK_WAIT_MS / 1000} s`

/**
 * Whether a live-looking holder is worth waiting for: a CLI in direct mode lets go within seconds, and
 * a holder in another pid namespace or boot may be a process gone whose lease has not lapsed yet.
 */
export const mayLetGo = async (holder: LockHolder) => holder.owner === 'cli' || isForeign(holder)

/**
 * Long enough for a CLI command in direct mode to open, migrate and close the embedded database, the
 * first of which creates it: PGlite's initdb took 8-20 s on a busy 2-core host, and at 10 s a second
 * CLI, or a server started meanwhile, gave up on a first command that was about to finish.
 */
export const LOCK_WAIT_MS = 60_000

/**
 * Takes the lock, retrying every 100 ms while the holder is one `keepWaiting` says will let go (and
 * until `ms` pass); otherwise returns the holder.
 */
export async function lockDataDir(
  dataDir: string,
  owner: LockOwner,
  ms: number,
  keepWaiting: (holder: LockHolder) => Promise<boolean>,
): Promise<DataDirLock | LockHolder> {
  // The monotonic clock: a wall clock stepped forward (a VM resumed from a pause, an NTP step) would
  // end the wait at once.
  const deadline = performance.now() + ms
  for (;;) {
    const result = await tryLockDataDir(dataDir, owner)
    if (isLock(result) || performance.now() >= deadline || !(await keepWaiting(result))) return result
    await Bun.sleep(100)
  }
}
