/**
 * Reads the project's Dockerfile into its stages, so the image test can follow the steps the file
 * itself lists (a source added to the image, a changed install command) rather than a copy of them.
 * Only the instructions this Dockerfile uses are understood; anything else fails the test loudly.
 */

export interface Instruction {
  keyword: string
  args: string
}

export interface Stage {
  name: string | null
  base: string
  instructions: Instruction[]
}

/** The Dockerfile's stages in order, each line continuation joined and comments dropped. */
export function parseDockerfile(text: string): Stage[] {
  const stages: Stage[] = []
  const logical: string[] = []
  let pending = ''
  for (const raw of text.split('\n')) {
    const line = raw.trim()
    if (pending === '' && (line === '' || line.startsWith('#'))) continue
    if (line.endsWith('\\')) {
      pending += `${line.slice(0, -1)} `
      continue
    }
    logical.push(pending + line)
    pending = ''
  }
  for (const line of logical) {
    const space = line.indexOf(' ')
    const keyword = line.slice(0, space).toUpperCase()
    const args = line.slice(space + 1).trim()
    if (keyword === 'FROM') {
      const [base = '', as, name] = args.split(/\s+/)
      stages.push({ name: as?.toUpperCase() === 'AS' ? (name ?? null) : null, base, instructions: [] })
    } else {
      const stage = stages.at(-1)
      if (!stage) throw new Error(`Dockerfile: ${keyword} before FROM`)
      stage.instructions.push({ keyword, args })
    }
  }
  return stages
}

/** An exec-form argument list (`["bun", "src/main.ts"]`), or null for the shell form. */
export function execForm(args: string): string[] | null {
  if (!args.startsWith('[')) return null
  const parsed: unknown = JSON.parse(args)
  if (!Array.isArray(parsed) || !parsed.every((a) => typeof a === 'string')) throw new Error(`not an exec form: ${args}`)
  return parsed
}

/** ENV's `KEY=value` pairs (unquoted values, as this Dockerfile writes them). */
export function envPairs(args: string): Record<string, string> {
  return Object.fromEntries(
    args.split(/\s+/).map((pair) => {
      const eq = pair.indexOf('=')
      if (eq <= 0) throw new Error(`ENV entry is not KEY=value: ${pair}`)
      return [pair.slice(0, eq), pair.slice(eq + 1)]
    }),
  )
}

/** COPY's flags, sources and destination. */
export function copyArgs(args: string): { from: string | null; sources: string[]; dest: string } {
  const words = args.split(/\s+/)
  let from: string | null = null
  while (words[0]?.startsWith('--')) {
    const flag = words.shift() as string
    if (flag.startsWith('--from=')) from = flag.slice('--from='.length)
    else throw new Error(`COPY flag the image test does not follow: ${flag}`)
  }
  const dest = words.pop()
  if (!dest || words.length === 0) throw new Error(`COPY without a source or destination: ${args}`)
  return { from, sources: words, dest }
}

/** HEALTHCHECK's command (exec form) after its options. */
export function healthcheckCommand(args: string): string[] | null {
  const at = args.indexOf('CMD ')
  return at < 0 ? null : execForm(args.slice(at + 'CMD '.length).trim())
}
