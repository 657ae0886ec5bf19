/**
 * The RESP parser under ioredis (redis-parser, patched at install): a reply it cannot take (arrays nested
 * deeper than any real reply, an array length no array can have) is a protocol error reported to its
 * connection, never an error thrown out of the socket's 'data' listener, which ended the process. What a
 * server on the connection can send is no more trusted than what a client of ours can.
 */
import { describe, expect, test } from 'bun:test'
import { createRequire } from 'node:module'

interface Parser {
  execute(chunk: Buffer): void
  reset(): void
}
type ParserClass = new (options: {
  returnReply(reply: unknown): void
  returnError(err: Error): void
  returnFatalError(err: Error): void
}) => Parser

// A dependency of ioredis, without types of its own; required as ioredis requires it.
const RedisParser = createRequire(import.meta.url)('redis-parser') as ParserClass

/** A parser fed `chunks` one `execute` each, and what it reported. */
function parse(...chunks: (string | Buffer)[]) {
  const replies: unknown[] = []
  const fatal: Error[] = []
  const parser = new RedisParser({
    returnReply: (reply) => replies.push(reply),
    returnError: (err) => fatal.push(err),
    returnFatalError: (err) => fatal.push(err),
  })
  for (const chunk of chunks) parser.execute(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk))
  return { parser, replies, fatal }
}

/** A reply of arrays nested `depth` deep around one integer. */
const nested = (depth: number) => `${'*1\r\n'.repeat(depth)}:7\r\n`

/** `text` cut into pieces of `size` bytes. */
const pieces = (text: string, size: number) => {
  const out: string[] = []
  for (let at = 0; at < text.length; at += size) out.push(text.slice(at, at + size))
  return out
}

/** The value `nested(depth)` parses to. */
function unwrap(reply: unknown, depth: number): unknown {
  let value = reply
  for (let level = 0; level < depth; level++) {
    expect(Array.isArray(value) && value.length === 1).toBe(true)
    value = (value as unknown[])[0]
  }
  return value
}

describe('redis reply parser: hostile replies', () => {
  test('arrays nested far past the stack are a fatal protocol error, not a thrown RangeError', () => {
    const { replies, fatal } = parse(nested(200_000))
    expect(replies).toEqual([])
    expect(fatal).toHaveLength(1)
    expect(fatal[0]?.name).toBe('ParserError')
    expect(fatal[0]?.message).toContain('deeper than 1024 levels')
  })

  test('the same reply split across many reads is refused once the resumed arrays pass the limit, and its rest ignored', () => {
    const { replies, fatal } = parse(...pieces(nested(200_000), 997))
    expect(replies).toEqual([])
    expect(fatal).toHaveLength(1)
    expect(fatal[0]?.message).toContain('deeper than 1024 levels')
  })

  test('1024 levels parse, whole or in pieces; 1025 do not', () => {
    expect(unwrap(parse(nested(1024)).replies[0], 1024)).toBe(7)
    expect(unwrap(parse(...pieces(nested(1024), 3)).replies[0], 1024)).toBe(7)
    const over = parse(...pieces(nested(1025), 3))
    expect(over.replies).toEqual([])
    expect(over.fatal[0]?.message).toContain('deeper than 1024 levels')
  })

  test('an array length no array can have is a fatal protocol error', () => {
    const { replies, fatal } = parse('*99999999999\r\n:1\r\n')
    expect(replies).toEqual([])
    expect(fatal).toHaveLength(1)
    expect(fatal[0]?.name).toBe('ParserError')
    // The reply's bytes are not kept on the error: they may be large and hold anything.
    expect((fatal[0] as Error & { buffer?: unknown }).buffer).toBe('(not kept)')
  })

  test('after a refused reply the parser takes nothing more until it is reset', () => {
    // 2,000 levels of a reply that goes on: refused before its end arrives.
    const { parser, replies, fatal } = parse(nested(5000).slice(0, 8000))
    expect(fatal).toHaveLength(1)
    // The refused reply's rest would parse as replies of their own.
    parser.execute(Buffer.from(':42\r\n'))
    expect(replies).toEqual([])
    parser.reset()
    parser.execute(Buffer.from(':42\r\n'))
    expect(replies).toEqual([42])
    expect(fatal).toHaveLength(1)
  })
})

describe('redis reply parser: ordinary replies', () => {
  test('nested arrays, split at every byte, parse as before', () => {
    const reply = '*3\r\n*2\r\n:1\r\n$3\r\nabc\r\n*0\r\n*-1\r\n+OK\r\n:5\r\n'
    expect(parse(reply).replies).toEqual([[[1, 'abc'], [], null], 'OK', 5])
    expect(parse(...pieces(reply, 1)).replies).toEqual([[[1, 'abc'], [], null], 'OK', 5])
  })

  test('a long flat array, as an authorize call answers, in one read and in pieces', () => {
    const values = Array.from({ length: 5000 }, (_, i) => i - 2500)
    const reply = `*${values.length}\r\n${values.map((v) => `:${v}\r\n`).join('')}`
    expect(parse(reply).replies).toEqual([values])
    expect(parse(...pieces(reply, 64)).replies).toEqual([values])
  })
})
