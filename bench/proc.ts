import { readFileSync } from 'node:fs'

/**
 * Name and CPU seconds (user + system) of a process or thread, from `/proc/<path>/stat` (`path` is a
 * pid or `<pid>/task/<tid>`); zero when it is gone. The name can hold spaces and parentheses, so the
 * fields are read after its last `)`.
 */
export function procCpu(path: string): { comm: string; seconds: number } {
  try {
    const f = readFileSync(`/proc/${path}/stat`, 'utf8')
    const rest = f.slice(f.lastIndexOf(')') + 2).split(' ')
    return { comm: f.slice(f.indexOf('(') + 1, f.lastIndexOf(')')), seconds: (Number(rest[11]) + Number(rest[12])) / 100 }
  } catch {
    return { comm: '', seconds: 0 }
  }
}

/**
 * A memory field of `/proc/<pid>/status` in MB: VmRSS (resident now) or VmHWM (the most it has been
 * resident); zero when the process is gone.
 */
export function procMemoryMb(pid: number | string, field: 'VmRSS' | 'VmHWM'): number {
  try {
    const kb = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]
    return kb ? Number(kb) / 1024 : 0
  } catch {
    return 0
  }
}

/** Idle and total jiffies of the whole machine, from the first line of /proc/stat. */
export function machineTicks(): { idle: number; total: number } {
  const f = (readFileSync('/proc/stat', 'utf8').split('\n')[0] ?? '').trim().split(/\s+/).slice(1).map(Number)
  return { idle: (f[3] ?? 0) + (f[4] ?? 0), total: f.reduce((a, b) => a + b, 0) }
}

/**
 * The Redis server's CPU seconds (INFO cpu) and the microseconds it spent running scripts (INFO
 * commandstats: EVAL and EVALSHA, the commands the scripts call included), read with redis-cli so no
 * client sits in this process. Script time apart from the rest (the sockets, the event loop) tells what
 * the authorize script itself costs, e.g. of the rate limits' keys.
 */
export function redisCounters(url: string): { cpuSeconds: number; scriptUs: number } {
  let info = ''
  try {
    info = Bun.spawnSync(['redis-cli', '-u', url, 'info', 'all']).stdout.toString()
  } catch {
    // No redis-cli here: the Redis columns show NaN, the rest of the run is unaffected.
  }
  const field = (name: string) => Number(new RegExp(`^${name}:([\\d.]+)`, 'm').exec(info)?.[1] ?? Number.NaN)
  const usec = (command: string) => Number(new RegExp(`^cmdstat_${command}:calls=\\d+,usec=(\\d+)`, 'm').exec(info)?.[1] ?? 0)
  return { cpuSeconds: field('used_cpu_user') + field('used_cpu_sys'), scriptUs: info ? usec('eval') + usec('evalsha') : Number.NaN }
}
