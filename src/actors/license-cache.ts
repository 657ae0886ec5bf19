import type { VariableMap } from '../db/schema'
import { BoundedMap, type Entry } from './bounded'
import { type CachedLicense, NO_VARIABLES, variablesJson } from './load'

/**
 * Fixed part of a record: size u32 | hash u32 | epoch f64 | expiresAt f64 (NaN: none) | maxHwidSlots
 * u32 | flags u8 | 3 bytes of padding | hwid count u32 | 4 bytes of padding. Then the identity (app id,
 * key: each u32 length + UTF-16 code units, so two different strings never share bytes), the label and
 * the variables' JSON (u32 length + UTF-8), the license's own app id when OTHER_APP, each HWID (u32
 * length + UTF-8), padded to 8.
 */
const HEADER = 40
const HWID_COUNT = 32
/** Where a record's flags byte sits. */
const FLAGS = 28
const LIVE = 1
const REVOKED = 2
const UNLIMITED = 4
const LABELLED = 8
/** The license belongs to another app than the one it was looked up under: its own app id follows the variables. */
const OTHER_APP = 16
const ALIGN = 8
const MIN_CAPACITY = 1 << 16
/**
 * The largest arena one ArrayBuffer takes here (Bun 1.4 refuses 4 GiB): what each cache reserves, as
 * address space, not memory. CACHE_MAX_MB stops at it (config.ts).
 */
const MAX_CAPACITY = 2 ** 31
const MIN_SLOTS = 1 << 12

const utf8Length = (text: string) => Buffer.byteLength(text, 'utf8')
const identityLength = (appId: string, key: string) => 8 + 2 * (appId.length + key.length)
const alignUp = (n: number) => Math.ceil(n / ALIGN) * ALIGN

/** The bytes a license's record takes in the cache: what it counts against CACHE_MAX_MB, exactly. */
export function licenseRecordBytes(appId: string, key: string, license: CachedLicense): number {
  let bytes = HEADER + identityLength(appId, key) + 8 + utf8Length(license.label ?? '') + utf8Length(variablesJson(license.variables))
  if (license.appId !== appId) bytes += 4 + utf8Length(license.appId)
  for (const hwid of license.hwids) bytes += 4 + utf8Length(hwid)
  return alignUp(bytes)
}

/**
 * The license entries of every app of the process, held off the JavaScript heap: each a record in one
 * byte arena, found through an open-addressing table in typed arrays, decoded at each read. Held as
 * objects (six or seven per license), a million licenses made every request of the process 5–12%
 * dearer and its p99 about three times as long, from the collector walking them; as records they are
 * a few buffers the collector never looks into, and their bytes are counted exactly, not estimated.
 *
 * Records sit in the arena in the order they were written, so the oldest go first when the bound
 * (`maxBytes`, less what `otherBytes` says the app entries hold) needs room. A replaced or dropped
 * record stays in place, dead, until the arena runs out at its end: then the live records move to its
 * front, oldest first still, and the arena grows in place (a resizable ArrayBuffer, so nothing is
 * copied to grow and no outgrown buffer lingers) to twice what they hold. Its memory follows the most it
 * held, up to `maxBytes` (past it only for one license larger than the whole bound, held alone). Keys that name no license are kept apart, on
 * the heap and bounded by count: anyone can send made-up keys, and they must never push real entries out.
 */
export class LicenseCache {
  readonly #backing: ArrayBuffer
  /** Views of the backing's whole length, made again when it is resized. */
  #arena!: Buffer
  #view!: DataView
  /** Where the next record goes; records lie between #tail and here. */
  #head = 0
  /** The oldest record that may still be live. */
  #tail = 0
  /** Bytes of live records. */
  #live = 0
  #count = 0
  /** Each slot: a record's offset ÷ 8 + 1, 0 when empty; #hashes holds the record's hash beside it. */
  #slots = new Uint32Array(MIN_SLOTS)
  #hashes = new Uint32Array(MIN_SLOTS)
  /** The identity of the key looked up, laid out as records hold theirs. */
  #scratch = Buffer.alloc(1024)
  readonly #absent: BoundedMap<Entry<CachedLicense>>

  constructor(
    private readonly maxBytes: number,
    absentLimit: number,
    private readonly otherBytes: () => number = () => 0,
  ) {
    // Reserved up to the largest arena, not the bound: a single license larger than the bound is still held, alone.
    this.#backing = new ArrayBuffer(Math.min(MIN_CAPACITY, this.#most), { maxByteLength: MAX_CAPACITY })
    this.#resize(this.#backing.byteLength)
    this.#absent = new BoundedMap(absentLimit)
  }

  /** The largest the arena grows: the bound, as one ArrayBuffer may be. */
  get #most(): number {
    return alignUp(Math.min(this.maxBytes, MAX_CAPACITY))
  }

  /** Bytes of the licenses held (their records). */
  get bytes(): number {
    return this.#live
  }

  /** Entries held, present and absent. */
  get size(): number {
    return this.#count + this.#absent.size
  }

  get(appId: string, key: string): Entry<CachedLicense> | undefined {
    const slot = this.#find(appId, key)
    if (slot < 0) return this.#absent.get(absentKey(appId, key))
    return this.#decode((this.#slots[slot]! - 1) * ALIGN, appId, key)
  }

  has(appId: string, key: string): boolean {
    return this.#find(appId, key) >= 0 || this.#absent.has(absentKey(appId, key))
  }

  set(appId: string, key: string, entry: Entry<CachedLicense>): void {
    this.delete(appId, key)
    if (entry.value === null) {
      this.#absent.set(absentKey(appId, key), { epoch: entry.epoch, value: null })
      return
    }
    const bytes = licenseRecordBytes(appId, key, entry.value)
    // The newest stays even alone over the bound: a request must find what its miss loaded.
    this.#evictFor(bytes, this.maxBytes)
    if (this.#head + bytes > this.#arena.length) this.#compact(bytes)
    const at = this.#head
    this.#write(at, bytes, appId, key, entry)
    this.#head += bytes
    this.#live += bytes
    this.#count++
    if (this.#count * 2 > this.#slots.length) this.#reindex(this.#slots.length * 2)
    else this.#insertSlot(at)
  }

  delete(appId: string, key: string): void {
    const slot = this.#find(appId, key)
    if (slot < 0) {
      this.#absent.delete(absentKey(appId, key))
      return
    }
    this.#kill((this.#slots[slot]! - 1) * ALIGN, slot)
  }

  /** Drops every entry. */
  clear(): void {
    this.#resize(Math.min(MIN_CAPACITY, this.#most))
    this.#head = this.#tail = this.#live = this.#count = 0
    this.#slots = new Uint32Array(MIN_SLOTS)
    this.#hashes = new Uint32Array(MIN_SLOTS)
    this.#absent.clear()
  }

  /** Drops the oldest licenses until the bound holds again (the app entries beside them grew). */
  trim(): void {
    this.#evictFor(0, this.maxBytes)
  }

  /** Drops the oldest licenses until `bytes` more, the live records and the app entries fit in `limit`. */
  #evictFor(bytes: number, limit: number): void {
    while (this.#live > 0 && this.#live + bytes + this.otherBytes() > limit) {
      const at = this.#tail
      const size = this.#view.getUint32(at, true)
      if (this.#arena[at + FLAGS]! & LIVE) this.#kill(at, this.#slotOf(at))
      this.#tail = at + size
    }
    if (this.#live === 0) this.#head = this.#tail = 0
  }

  /** Marks the record at `at` dead and empties its slot. */
  #kill(at: number, slot: number): void {
    this.#arena[at + FLAGS]! &= ~LIVE
    this.#live -= this.#view.getUint32(at, true)
    this.#count--
    this.#removeSlot(slot)
  }

  /**
   * Moves the live records to the front of the arena, oldest first, and grows it in place to twice
   * their size and `need` (in steps of the minimum, at most the bound); the table follows them.
   */
  #compact(need: number): void {
    const most = this.#most
    // A large arena at its largest keeps a quarter free after a compaction: full, it would move its
    // records for every one written. (A small one may: a move of at most MIN_CAPACITY costs little.)
    if (most > MIN_CAPACITY && 2 * (this.#live + need) > most) this.#evictFor(need, (3 * most) / 4)
    const arena = this.#arena
    let head = 0
    // Runs of live records move in one copy each (a copy within one buffer is a memmove): growing an
    // arena with nothing dead in it moves nothing.
    let run = this.#tail
    for (let at = this.#tail; at < this.#head; ) {
      const size = this.#view.getUint32(at, true)
      if (!(arena[at + FLAGS]! & LIVE)) {
        if (at > run) head += arena.copy(arena, head, run, at)
        run = at + size
      }
      at += size
    }
    if (this.#head > run) head += arena.copy(arena, head, run, this.#head)
    const moved = this.#tail !== 0 || head !== this.#head
    this.#tail = 0
    this.#head = head
    const twice = Math.ceil((2 * (this.#live + need)) / MIN_CAPACITY) * MIN_CAPACITY
    const length = Math.max(Math.min(twice, most), this.#live + need)
    if (length > this.#backing.byteLength) this.#resize(length)
    if (moved) this.#reindex(this.#slots.length)
  }

  #resize(length: number): void {
    if (length !== this.#backing.byteLength) this.#backing.resize(length)
    this.#arena = Buffer.from(this.#backing, 0, length)
    this.#view = new DataView(this.#backing, 0, length)
  }

  /** Rebuilds the table with `slots` slots (or more, to stay at most half full) over the live records. */
  #reindex(slots: number): void {
    while (this.#count * 2 > slots) slots *= 2
    this.#slots = new Uint32Array(slots)
    this.#hashes = new Uint32Array(slots)
    for (let at = this.#tail; at < this.#head; at += this.#view.getUint32(at, true)) {
      if (this.#arena[at + FLAGS]! & LIVE) this.#insertSlot(at)
    }
  }

  #insertSlot(at: number): void {
    const hash = this.#view.getUint32(at + 4, true)
    const mask = this.#slots.length - 1
    let slot = hash & mask
    while (this.#slots[slot] !== 0) slot = (slot + 1) & mask
    this.#slots[slot] = at / ALIGN + 1
    this.#hashes[slot] = hash
  }

  /** The slot of the live record at `at`. */
  #slotOf(at: number): number {
    const mask = this.#slots.length - 1
    const mark = at / ALIGN + 1
    let slot = this.#view.getUint32(at + 4, true) & mask
    while (this.#slots[slot] !== mark) slot = (slot + 1) & mask
    return slot
  }

  /** Empties `slot`, moving later entries of its probe run back so that every lookup still finds them. */
  #removeSlot(slot: number): void {
    const slots = this.#slots
    const hashes = this.#hashes
    const mask = slots.length - 1
    let hole = slot
    for (let next = (hole + 1) & mask; slots[next] !== 0; next = (next + 1) & mask) {
      const home = hashes[next]! & mask
      // The entry at `next` may fill the hole unless its home lies cyclically in (hole, next].
      const stays = hole <= next ? hole < home && home <= next : hole < home || home <= next
      if (stays) continue
      slots[hole] = slots[next]!
      hashes[hole] = hashes[next]!
      hole = next
    }
    slots[hole] = 0
    hashes[hole] = 0
  }

  /** The slot of the live record of (appId, key), or -1. */
  #find(appId: string, key: string): number {
    const length = identityLength(appId, key)
    if (this.#scratch.length < length) this.#scratch = Buffer.alloc(2 * length)
    const scratch = this.#scratch
    writeIdentity(scratch, 0, appId, key)
    const hash = fnv1a(scratch, 0, length)
    const slots = this.#slots
    const mask = slots.length - 1
    for (let slot = hash & mask; slots[slot] !== 0; slot = (slot + 1) & mask) {
      if (this.#hashes[slot] !== hash) continue
      const at = (slots[slot]! - 1) * ALIGN + HEADER
      if (at + length <= this.#arena.length && this.#arena.compare(scratch, 0, length, at, at + length) === 0) return slot
    }
    return -1
  }

  #write(at: number, size: number, appId: string, key: string, { epoch, value }: Entry<CachedLicense>): void {
    const license = value!
    const arena = this.#arena
    const view = this.#view
    arena.fill(0, at, at + size)
    let p = at + HEADER
    p = writeIdentity(arena, p, appId, key)
    view.setUint32(at, size, true)
    view.setUint32(at + 4, fnv1a(arena, at + HEADER, p), true)
    view.setFloat64(at + 8, epoch, true)
    view.setFloat64(at + 16, license.expiresAt ?? Number.NaN, true)
    view.setUint32(at + 24, license.maxHwidSlots, true)
    const otherApp = license.appId !== appId
    arena[at + FLAGS] =
      LIVE |
      (license.status === 'revoked' ? REVOKED : 0) |
      (license.unlimitedHwidSlots ? UNLIMITED : 0) |
      (license.label === null ? 0 : LABELLED) |
      (otherApp ? OTHER_APP : 0)
    view.setUint32(at + HWID_COUNT, license.hwids.length, true)
    p = writeText(arena, view, p, license.label ?? '')
    p = writeText(arena, view, p, variablesJson(license.variables))
    if (otherApp) p = writeText(arena, view, p, license.appId)
    for (const hwid of license.hwids) p = writeText(arena, view, p, hwid)
  }

  #decode(at: number, appId: string, key: string): Entry<CachedLicense> {
    const arena = this.#arena
    const view = this.#view
    const flags = arena[at + FLAGS]!
    const expiresAt = view.getFloat64(at + 16, true)
    let p = at + HEADER + identityLength(appId, key)
    const labelLength = view.getUint32(p, true)
    const label = flags & LABELLED ? arena.toString('utf8', p + 4, p + 4 + labelLength) : null
    p += 4 + labelLength
    const variablesLength = view.getUint32(p, true)
    const variables: VariableMap = variablesLength === 0 ? NO_VARIABLES : JSON.parse(arena.toString('utf8', p + 4, p + 4 + variablesLength))
    p += 4 + variablesLength
    let licenseAppId = appId
    if (flags & OTHER_APP) {
      const length = view.getUint32(p, true)
      licenseAppId = arena.toString('utf8', p + 4, p + 4 + length)
      p += 4 + length
    }
    const hwids: string[] = new Array(view.getUint32(at + HWID_COUNT, true))
    for (let i = 0; i < hwids.length; i++) {
      const length = view.getUint32(p, true)
      hwids[i] = arena.toString('utf8', p + 4, p + 4 + length)
      p += 4 + length
    }
    return {
      epoch: view.getFloat64(at + 8, true),
      value: {
        key,
        appId: licenseAppId,
        status: flags & REVOKED ? 'revoked' : 'active',
        expiresAt: Number.isNaN(expiresAt) ? null : expiresAt,
        maxHwidSlots: view.getUint32(at + 24, true),
        unlimitedHwidSlots: (flags & UNLIMITED) !== 0,
        hwids,
        label,
        variables,
      },
    }
  }
}

/** App ids are UUIDs (no space), so the pair is one string no other pair shares. */
const absentKey = (appId: string, key: string) => `${appId} ${key}`

function writeIdentity(buffer: Buffer, at: number, appId: string, key: string): number {
  buffer.writeUInt32LE(appId.length, at)
  buffer.write(appId, at + 4, 'utf16le')
  const keyAt = at + 4 + 2 * appId.length
  buffer.writeUInt32LE(key.length, keyAt)
  buffer.write(key, keyAt + 4, 'utf16le')
  return keyAt + 4 + 2 * key.length
}

function writeText(buffer: Buffer, view: DataView, at: number, text: string): number {
  const length = text.length === 0 ? 0 : buffer.write(text, at + 4, 'utf8')
  view.setUint32(at, length, true)
  return at + 4 + length
}

/** FNV-1a over bytes[from, to). */
function fnv1a(bytes: Uint8Array, from: number, to: number): number {
  let hash = 0x811c9dc5
  for (let i = from; i < to; i++) hash = Math.imul(hash ^ bytes[i]!, 0x01000193)
  return hash >>> 0
}
