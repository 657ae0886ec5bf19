/**
 * Where a profiled server's busy time went, by sample count:
 *
 *   bun bench/profile.ts <file.cpuprofile> [--top 40]
 *
 * Reads the samples a BENCH_PROFILE_DIR run wrote (bench/server.ts, profileFlags) and prints each
 * function's share of them, its own (self) and with what it calls (inclusive). Every sample counts
 * once: the profiler's own totals weigh a sample by the time since the one before it, which after an
 * idle spell between scenarios is the whole spell.
 */
import { readFileSync } from 'node:fs'
import { relative } from 'node:path'
import { parseArgs } from 'node:util'

interface ProfileNode {
  id: number
  callFrame: { functionName: string; url: string; lineNumber: number }
  children?: number[]
}

/** The Chrome DevTools format Bun's --cpu-prof writes. */
interface CpuProfile {
  nodes: ProfileNode[]
  samples: number[]
}

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: { top: { type: 'string', default: '40' } },
})
const file = positionals[0]
const top = Number(values.top)
if (!file || !Number.isInteger(top) || top < 1) {
  console.error('usage: bun bench/profile.ts <file.cpuprofile> [--top 40]')
  process.exit(2)
}

const profile = JSON.parse(readFileSync(file, 'utf8')) as CpuProfile
const nodes = new Map(profile.nodes.map((node) => [node.id, node]))
const parents = new Map<number, number>()
for (const node of profile.nodes) for (const child of node.children ?? []) parents.set(child, node.id)

const root = process.cwd()
const names = new Map<number, string>()
const nameOf = (id: number): string => {
  let name = names.get(id)
  if (name === undefined) {
    const { functionName, url, lineNumber } = (nodes.get(id) as ProfileNode).callFrame
    const path = url.replace(/^file:\/\//, '')
    const shown = path.startsWith(`${root}/`) ? relative(root, path) : path
    const where = url ? `${shown}:${lineNumber + 1}` : '(native)'
    name = `${functionName || '(anonymous)'} ${where}`
    names.set(id, name)
  }
  return name
}

const own = new Map<string, number>()
const within = new Map<string, number>()
for (const id of profile.samples) {
  own.set(nameOf(id), (own.get(nameOf(id)) ?? 0) + 1)
  // A recursive function counts once per sample.
  const seen = new Set<string>()
  for (let at: number | undefined = id; at !== undefined; at = parents.get(at)) seen.add(nameOf(at))
  for (const name of seen) within.set(name, (within.get(name) ?? 0) + 1)
}

const table = (title: string, counts: Map<string, number>) => {
  console.log(`\n${title}`)
  for (const [name, n] of [...counts].sort((a, b) => b[1] - a[1]).slice(0, top)) {
    console.log(`${((100 * n) / profile.samples.length).toFixed(1).padStart(6)}%  ${name}`)
  }
}
console.log(`${profile.samples.length} samples`)
table('self', own)
table('inclusive', within)
