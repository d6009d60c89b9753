// Listeners that cannot break the client: each is called in its own try/catch, so a listener that throws neither
// stops the others nor reaches the transport's callbacks (a throw inside a data channel's or a room's handler can
// take the link down). The first exception of each listener is logged; later ones of the same listener are counted
// and dropped, so a listener that throws on every frame does not flood the console.

export interface Logger {
  warn(...args: unknown[]): void;
  error(...args: unknown[]): void;
}

type Listener<A> = (payload: A) => void;

export class Emitter<Events extends { [name: string]: unknown }> {
  private readonly listeners = new Map<keyof Events, Set<Listener<never>>>();
  private readonly logged = new WeakSet<object>();
  /** Exceptions thrown by listeners (each was caught). */
  listenerErrors = 0;

  constructor(private readonly logger: Logger) {}

  /** Calls `listener` on each `name` event; returns a function that removes it. */
  on<K extends keyof Events>(name: K, listener: Listener<Events[K]>): () => void {
    let set = this.listeners.get(name);
    if (set === undefined) {
      set = new Set();
      this.listeners.set(name, set);
    }
    set.add(listener as Listener<never>);
    return () => this.off(name, listener);
  }

  off<K extends keyof Events>(name: K, listener: Listener<Events[K]>): void {
    this.listeners.get(name)?.delete(listener as Listener<never>);
  }

  emit<K extends keyof Events>(name: K, payload: Events[K]): void {
    const set = this.listeners.get(name);
    if (set === undefined) return;
    for (const listener of [...set]) {
      try {
        (listener as Listener<Events[K]>)(payload);
      } catch (error) {
        this.listenerErrors += 1;
        if (!this.logged.has(listener)) {
          this.logged.add(listener);
          this.logger.error(`lingstream: a '${String(name)}' listener threw (logged once; the session goes on)`, error);
        }
      }
    }
  }

  clear(): void {
    this.listeners.clear();
  }
}
