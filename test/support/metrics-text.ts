/** The value of the one sample in a Prometheus exposition whose name and labels start with `prefix`, 0 when absent. */
export function sample(text: string, prefix: string): number {
  const line = text.split('\n').find((l) => l.startsWith(prefix))
  return line ? Number(line.slice(line.lastIndexOf(' ') + 1)) : 0
}
