/**
 * `target` with some of its methods replaced, for tests that steer or watch a shared store: every other
 * member is the target's own, methods bound to it (a RedisStore's private fields need their own `this`).
 */
export function withOverrides<T extends object>(target: T, overrides: Partial<T>): T {
  return new Proxy(target, {
    get(object, prop) {
      if (Object.hasOwn(overrides, prop)) return overrides[prop as keyof T]
      const value = Reflect.get(object, prop, object)
      return typeof value === 'function' ? value.bind(object) : value
    },
  })
}
