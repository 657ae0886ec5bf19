/**
 * The production image without Docker: the Dockerfile's own steps replayed in temp directories (its
 * builder stage's COPY and `npm ci --omit=dev`, the final stage's COPY, ENV, CMD and HEALTHCHECK), with
 * this checkout's Bun standing for the base image's. Proves the image carries no second Bun, starts,
 * answers its health check, provisions through `bun run cli` and stops cleanly on SIGTERM.
 */
import { afterAll, describe, expect, test } from 'bun:test'
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { basename, join, posix } from 'node:path'
import { launchSettingsOf } from '../support/server-process'
import { freePort, until } from '../support/servers'
import { MODE, TEST_DATABASE_URL, TEST_MASTER_KEY, TEST_REDIS_URL } from '../support/helpers'
import { LAUNCH_ENV } from '../../src/server-processes'
import { copyArgs, envPairs, execForm, healthcheckCommand, parseDockerfile, type Stage } from './dockerfile'

const ROOT = join(import.meta.dir, '..', '..')
const stages = parseDockerfile(readFileSync(join(ROOT, 'Dockerfile'), 'utf8'))
const finalStage = stages.at(-1) as Stage
const scratch = mkdtempSync(join(tmpdir(), 'ls-image-'))
const dockerignore = readFileSync(join(ROOT, '.dockerignore'), 'utf8')
  .split('\n')
  .map((line) => line.trim())
  .filter((line) => line !== '' && !line.startsWith('#'))
// Literal entries only (its one glob names logs): a source the build context leaves out never reaches the image.
const leftOutOfContext = (source: string) => dockerignore.some((entry) => source === entry || source.startsWith(`${entry}/`))
afterAll(() => rmSync(scratch, { recursive: true, force: true }))

interface Built {
  root: string
  workdir: string
  env: Record<string, string>
  user: string | null
  cmd: string[] | null
  healthcheck: string[] | null
}

/**
 * Replays one stage into its own root directory (absolute paths land under it). RUN runs in builder
 * stages only: the final stage's RUN prepares the image's /data for its user, which a temp DATA_DIR
 * stands for here.
 */
function build(stage: Stage, built: Map<string, Built>): Built {
  const root = join(scratch, stage.name ?? 'final')
  const result: Built = { root, workdir: '/', env: {}, user: null, cmd: null, healthcheck: null }
  const inRoot = (path: string) => join(root, posix.resolve(result.workdir, path))
  for (const { keyword, args } of stage.instructions) {
    if (keyword === 'WORKDIR') {
      result.workdir = posix.resolve(result.workdir, args)
      mkdirSync(join(root, result.workdir), { recursive: true })
    } else if (keyword === 'COPY') {
      const { from, sources, dest } = copyArgs(args)
      const origin = from === null ? ROOT : built.get(from)?.root
      if (!origin) throw new Error(`COPY --from=${from}: no such stage before it`)
      for (const source of sources) {
        if (from === null && leftOutOfContext(source)) throw new Error(`COPY ${source}: .dockerignore leaves it out of the build context`)
        const target = dest.endsWith('/') ? join(inRoot(dest), basename(source)) : inRoot(dest)
        cpSync(join(origin, source), target, { recursive: true })
      }
    } else if (keyword === 'RUN' && stage !== finalStage) {
      const run = Bun.spawnSync(['sh', '-c', args], { cwd: join(root, result.workdir), stdout: 'pipe', stderr: 'pipe' })
      if (run.exitCode !== 0) throw new Error(`RUN ${args} failed:\n${run.stderr.toString()}`)
    } else if (keyword === 'ENV') Object.assign(result.env, envPairs(args))
    else if (keyword === 'USER') result.user = args
    else if (keyword === 'CMD') result.cmd = execForm(args)
    else if (keyword === 'HEALTHCHECK') result.healthcheck = healthcheckCommand(args)
    else if (!['RUN', 'VOLUME', 'EXPOSE'].includes(keyword)) throw new Error(`Dockerfile instruction the image test does not follow: ${keyword}`)
  }
  return result
}

function buildImage(): Built {
  const built = new Map<string, Built>()
  for (const stage of stages) {
    const result = build(stage, built)
    if (stage.name) built.set(stage.name, result)
    if (stage === finalStage) return result
  }
  throw new Error('the Dockerfile has no stage')
}

describe('the production image', () => {
  test('has no second Bun, starts, passes its health check, provisions and stops on SIGTERM', async () => {
    const image = buildImage()
    const app = join(image.root, image.workdir)
    expect(existsSync(join(app, 'node_modules', 'elysia'))).toBe(true)
    // npm ci's postinstall patched the drivers (patches/): a connection lost in a transaction, a
    // PostgreSQL message or a Redis reply the client cannot take, or a cluster's slots of another shape,
    // would end the process.
    expect(readFileSync(join(app, 'node_modules', 'postgres', 'src', 'index.js'), 'utf8')).toContain('connection.onclose = e => reject(closed = e)')
    expect(readFileSync(join(app, 'node_modules', 'postgres', 'src', 'connection.js'), 'utf8')).toContain('function nameEnd(')
    expect(readFileSync(join(app, 'node_modules', 'redis-parser', 'lib', 'parser.js'), 'utf8')).toContain('const MAX_NESTING = 1024')
    expect(readFileSync(join(app, 'node_modules', 'ioredis', 'built', 'cluster', 'index.js'), 'utf8')).toContain('function isSlotsReply(')
    for (const path of ['bun', '@oven', '.bin/bun']) expect(existsSync(join(app, 'node_modules', path))).toBe(false)

    expect(image.user === null || ['root', '0'].includes(image.user.split(':')[0] ?? '')).toBe(false)
    // Exec forms: a shell as PID 1 would not pass docker stop's SIGTERM on to the server.
    if (!image.cmd || !image.healthcheck) throw new Error('CMD and HEALTHCHECK must use the exec form')

    // The base image's Bun: this checkout's binary, found as `bun` on the PATH.
    const bin = join(scratch, 'bin')
    mkdirSync(bin, { recursive: true })
    symlinkSync(process.execPath, join(bin, 'bun'))
    // Built once (npm ci is most of this test's time), the image runs on each backend of this pass: the
    // embedded default always, and PostgreSQL + Redis in their pass, which alone runs this file in CI.
    const backends = MODE === 'postgres' ? [{}, { DATABASE_URL: TEST_DATABASE_URL ?? '', REDIS_URL: TEST_REDIS_URL ?? '' }] : [{}]
    for (const [i, backend] of backends.entries()) {
      const env = {
        PATH: `${bin}:/usr/local/bin:/usr/bin:/bin`,
        HOME: scratch,
        ...image.env,
        PORT: String(await freePort()),
        DATA_DIR: join(scratch, `data-${i}`),
        MASTER_KEY: TEST_MASTER_KEY.toString('hex'),
        ...backend,
      }
      const inImage = (cmd: string[]) => Bun.spawn(cmd, { cwd: app, env, stdout: 'pipe', stderr: 'pipe' })
      const healthy = async () => (await inImage(image.healthcheck as string[]).exited) === 0

      const server = inImage(image.cmd)
      const serverLog = new Response(server.stderr).text()
      try {
        expect(await until(healthy, (ok) => ok || server.exitCode !== null, 45_000)).toBe(true)
        // The allocator reads its setting only as the process starts: the image's ENV must carry it.
        expect(launchSettingsOf(server.pid)).toEqual(LAUNCH_ENV)

        const cli = inImage(['bun', 'run', 'cli', 'account', 'create', '--name', 'Image check'])
        const [out, err, code] = await Promise.all([new Response(cli.stdout).text(), new Response(cli.stderr).text(), cli.exited])
        expect(code).toBe(0)
        // bunfig.toml keeps `bun run` from echoing the command line, `apikey revoke --key svc_live_…` included.
        expect(err).toBe('')
        const lastLine = out.trim().split('\n').at(-1) ?? ''
        expect(JSON.parse(lastLine)).toMatchObject({ accountId: expect.any(String), apiKey: expect.stringMatching(/^svc_live_/) })
      } catch (err) {
        server.kill('SIGKILL')
        const on = backend.DATABASE_URL ? 'PostgreSQL + Redis' : 'the embedded default'
        throw new Error(`on ${on}: ${(err as Error).message}\nserver log:\n${await serverLog}`)
      }
      server.kill('SIGTERM')
      expect(await server.exited).toBe(0)
      // The probe can fail: with the server gone it reports unhealthy.
      expect(await healthy()).toBe(false)
    }
  }, 150_000)

  test('npm start launches the server with the same allocator setting as the image', () => {
    const { scripts } = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> }
    const settings = Object.entries(LAUNCH_ENV).map(([name, value]) => `${name}=${value}`)
    // exec: Bun replaces npm's shell, so a SIGTERM to npm reaches it (npm-start.test.ts).
    expect(scripts.start).toBe(`${settings.join(' ')} exec bun src/main.ts`)
  })
})
