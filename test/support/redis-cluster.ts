/**
 * A Redis Cluster of a test's (or a bench's) own: masters without replicas or persistence, on free
 * ports of a range, in a temporary directory that `stop` removes with the processes.
 */
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import Redis from 'ioredis'
import { canListen, reapOrphanedServers, until } from './servers'

const CLUSTER_DIR_PREFIX = 'ls-redis-cluster-'

export interface OwnRedisCluster {
  /** The seed nodes as REDIS_URL takes them with REDIS_CLUSTER=true. */
  url: string
  ports: number[]
  /** A plain connection to each master, in port order (FLUSHALL, DBSIZE, CLUSTER … on one node). */
  nodes: Redis[]
  /** The masters' process ids, in port order: SIGSTOP makes a node that keeps its connections and answers nothing. */
  pids: number[]
  /** Kills the servers and removes their directory. */
  stop(): Promise<void>
}

/** `count` ports of [first, last] that are free, each with its cluster bus port (+10000) free too. */
async function freePorts(count: number, first: number, last: number): Promise<number[]> {
  const ports: number[] = []
  const start = first + Math.floor(Math.random() * (last - first + 1))
  for (let i = 0; i <= last - first && ports.length < count; i++) {
    const port = first + ((start - first + i) % (last - first + 1))
    if ((await canListen(port)) && (await canListen(port + 10_000))) ports.push(port)
  }
  if (ports.length < count) throw new Error(`fewer than ${count} free ports in ${first}-${last}`)
  return ports
}

/**
 * Starts `masters` redis-servers on ports of [first, last], joins them as one cluster and waits until it
 * serves every slot; `empty` more masters join it holding no slot (after the others in `nodes` and
 * `ports`, not in `url`), for a reshard to move slots to.
 */
export async function ownRedisCluster({ masters = 3, empty = 0, first = 7101, last = 7199 } = {}): Promise<OwnRedisCluster> {
  const dir = mkdtempSync(join(tmpdir(), CLUSTER_DIR_PREFIX))
  reapOrphanedServers(CLUSTER_DIR_PREFIX)
  const ports = await freePorts(masters + empty, first, last)
  const procs = ports.map((port) =>
    Bun.spawn(
      [
        'redis-server', '--port', String(port), '--bind', '127.0.0.1', '--dir', dir,
        '--cluster-enabled', 'yes', '--cluster-config-file', join(dir, `nodes-${port}.conf`),
        '--save', '', '--appendonly', 'no', '--daemonize', 'no',
      ],
      { stdout: 'ignore', stderr: 'ignore' },
    ),
  )
  const nodes = ports.map((port) => new Redis(port, '127.0.0.1', { maxRetriesPerRequest: 1, lazyConnect: true }))
  for (const node of nodes) node.on('error', () => {})
  const stop = async () => {
    for (const node of nodes) node.disconnect()
    for (const proc of procs) proc.kill('SIGKILL')
    await Promise.all(procs.map((proc) => proc.exited))
    rmSync(dir, { recursive: true, force: true })
  }
  try {
    for (const node of nodes) {
      const up = await until(() => node.ping().catch(() => null), (pong) => pong === 'PONG')
      if (up !== 'PONG') throw new Error('a cluster node did not start')
    }
    const create = Bun.spawnSync([
      'redis-cli', '--cluster', 'create', ...ports.slice(0, masters).map((port) => `127.0.0.1:${port}`), '--cluster-replicas', '0', '--cluster-yes',
    ])
    if (create.exitCode !== 0) throw new Error(`redis-cli --cluster create failed: ${create.stdout.toString()}${create.stderr.toString()}`)
    for (const port of ports.slice(masters)) {
      const join = Bun.spawnSync(['redis-cli', '--cluster', 'add-node', `127.0.0.1:${port}`, `127.0.0.1:${ports[0]}`])
      if (join.exitCode !== 0) throw new Error(`redis-cli --cluster add-node failed: ${join.stdout.toString()}${join.stderr.toString()}`)
    }
    for (const node of nodes) {
      const info = await until(() => node.cluster('INFO'), (text) => text.includes('cluster_state:ok'), 20_000)
      if (!info.includes('cluster_state:ok')) throw new Error('the cluster did not reach cluster_state:ok')
    }
  } catch (err) {
    await stop()
    throw err
  }
  return { url: ports.slice(0, masters).map((port) => `redis://127.0.0.1:${port}`).join(','), ports, nodes, pids: procs.map((proc) => proc.pid), stop }
}

export interface OwnReplicatedCluster {
  /** Every node as REDIS_URL takes them with REDIS_CLUSTER=true. */
  url: string
  /** Plain connections to the first node that starts as a master and to its replica. */
  master: Redis
  replica: Redis
  /** Every master (the slots split evenly among them, in order) and each one's replica, in the same order. */
  masters: Redis[]
  replicas: Redis[]
  stop(): Promise<void>
}

/** A Redis Cluster of `masters` masters (one, by default, serving every slot), each with one replica: what a failover needs. */
export async function ownReplicatedCluster({ masters: count = 1, first = 7101, last = 7199 } = {}): Promise<OwnReplicatedCluster> {
  const dir = mkdtempSync(join(tmpdir(), CLUSTER_DIR_PREFIX))
  reapOrphanedServers(CLUSTER_DIR_PREFIX)
  const ports = await freePorts(2 * count, first, last)
  const procs = ports.map((port) =>
    Bun.spawn(
      [
        'redis-server', '--port', String(port), '--bind', '127.0.0.1', '--dir', dir,
        '--cluster-enabled', 'yes', '--cluster-config-file', join(dir, `nodes-${port}.conf`), '--cluster-node-timeout', '2000',
        '--save', '', '--appendonly', 'no', '--daemonize', 'no',
      ],
      { stdout: 'ignore', stderr: 'ignore' },
    ),
  )
  const nodes = ports.map((port) => new Redis(port, '127.0.0.1', { maxRetriesPerRequest: 1 }))
  for (const node of nodes) node.on('error', () => {})
  const [masters, replicas] = [nodes.slice(0, count), nodes.slice(count)]
  const stop = async () => {
    for (const node of nodes) node.disconnect()
    for (const proc of procs) proc.kill('SIGKILL')
    await Promise.all(procs.map((proc) => proc.exited))
    rmSync(dir, { recursive: true, force: true })
  }
  try {
    for (const node of nodes) {
      if ((await until(() => node.ping().catch(() => null), (pong) => pong === 'PONG')) !== 'PONG') throw new Error('a cluster node did not start')
    }
    const per = Math.ceil(16_384 / count)
    for (const [i, master] of masters.entries()) {
      await master.call('CLUSTER', 'ADDSLOTSRANGE', String(i * per), String(Math.min(16_383, (i + 1) * per - 1)))
    }
    for (const node of nodes.slice(1)) await node.cluster('MEET', '127.0.0.1', ports[0]!)
    for (const [i, replica] of replicas.entries()) {
      const masterId = (await masters[i]!.cluster('MYID')) as string
      await until(() => replica.cluster('NODES') as Promise<string>, (known) => known.includes(masterId), 10_000)
      await until(() => replica.cluster('REPLICATE', masterId).then(() => true, () => false), (ok) => ok, 10_000)
      const linked = await until(() => replica.info('replication'), (info) => info.includes('master_link_status:up'), 20_000)
      if (!linked.includes('master_link_status:up')) throw new Error('a replica did not link to its master')
    }
    for (const node of nodes) {
      const ok = await until(() => node.cluster('INFO') as Promise<string>, (info) => info.includes('cluster_state:ok'), 20_000)
      if (!ok.includes('cluster_state:ok')) throw new Error('the cluster did not reach cluster_state:ok')
    }
  } catch (err) {
    await stop()
    throw err
  }
  return { url: ports.map((port) => `redis://127.0.0.1:${port}`).join(','), master: masters[0]!, replica: replicas[0]!, masters, replicas, stop }
}
