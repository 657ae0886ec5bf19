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
