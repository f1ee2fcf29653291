import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";

import { Codes, CondfsError, connectionError } from "./errors.js";
import { runWithCLI, type RunOptions, type RunResult } from "./run.js";
import type {
  Block,
  ChangesCommitResult,
  ChangesDiffResult,
  ChangesDiscardResult,
  CheckpointCreateResult,
  CheckpointInfo,
  ConfigStatus,
  Context,
  Decision,
  Methods,
  PathDecision,
  RollbackResult,
  SessionCloseParams,
  SessionInfo,
  SessionOpenParams,
  Space,
  Status,
  ToolDecideParams,
} from "./types.js";

/** The daemon refuses a request line over 1 MiB (and closes the connection). */
export const MAX_LINE = 1 << 20;

// Methods that change nothing, or leave the same state when made twice: one
// whose connection was lost before its answer is sent again once, on a new
// connection. session.open, session.close and config.reload are not.
const REPEATABLE = new Set<string>([
  "status",
  "session.list",
  "context.get",
  "context.set",
  "blocks.list",
  "path.check",
  "tool.decide",
  "tools.callable",
  "checkpoint.list",
  "changes.diff",
]);

/**
 * $CONDFS_SOCKET, else the daemon's default path for this user:
 * /run/condfs/condfs.sock for root, $XDG_RUNTIME_DIR/condfs/condfs.sock, else
 * condfs-UID/condfs.sock under the temporary directory.
 */
export function defaultSocket(): string {
  const env = process.env.CONDFS_SOCKET;
  if (env) return env;
  const uid = process.geteuid?.() ?? -1;
  if (uid === 0) return "/run/condfs/condfs.sock";
  const xdg = process.env.XDG_RUNTIME_DIR;
  if (xdg) return path.join(xdg, "condfs", "condfs.sock");
  return path.join(os.tmpdir(), `condfs-${uid}`, "condfs.sock");
}

export interface ClientOptions {
  /** The control socket (default: defaultSocket()). */
  socket?: string;
  /** Bounds each request, in milliseconds (default: none). */
  timeout?: number;
  /** The condfs binary Session.run starts (default: $CONDFS_BIN, else `condfs` on PATH). */
  condfs?: string;
}

interface Pending {
  resolve: (v: unknown) => void;
  reject: (e: CondfsError) => void;
  method: string;
}

/** One connection; answers are handed to the request of their id. */
class Connection {
  readonly sock: net.Socket;
  dead: CondfsError | undefined;
  private readonly pending = new Map<number, Pending>();
  private nextId = 0;
  private buf: Buffer[] = [];
  private bufLen = 0;

  private constructor(
    readonly socketPath: string,
    sock: net.Socket,
  ) {
    this.sock = sock;
    sock.on("data", (chunk: Buffer) => this.onData(chunk));
    sock.on("error", (err) => this.die(connectionError(socketPath, "the connection failed", err)));
    sock.on("close", () => this.die(undefined));
    sock.unref();
  }

  static open(socketPath: string, timeout: number | undefined): Promise<Connection> {
    return new Promise((resolve, reject) => {
      const sock = net.createConnection({ path: socketPath });
      const timer = setTimeout(() => {
        sock.destroy();
        reject(connectionError(socketPath, "cannot connect within the timeout"));
      }, timeout ?? 5000);
      sock.once("connect", () => {
        clearTimeout(timer);
        sock.removeAllListeners("error");
        resolve(new Connection(socketPath, sock));
      });
      sock.once("error", (err) => {
        clearTimeout(timer);
        reject(
          connectionError(socketPath, "cannot connect (is condfs serve running, and may this user use its socket?)", err),
        );
      });
    });
  }

  send(method: string, params: unknown): { id: number; answer: Promise<unknown> } {
    if (this.dead) throw this.dead;
    const id = ++this.nextId;
    const line = JSON.stringify({ jsonrpc: "2.0", id, method, params }) + "\n";
    const size = Buffer.byteLength(line) - 1;
    if (size > MAX_LINE) {
      throw new CondfsError(
        Codes.INVALID_REQUEST,
        `${method}: the request is ${size} bytes, over the daemon's ${MAX_LINE}-byte line limit`,
      );
    }
    const answer = new Promise<unknown>((resolve, reject) => {
      this.pending.set(id, { resolve, reject, method });
    });
    this.sock.ref(); // an answer is awaited: the process waits for it
    this.sock.write(line);
    return { id, answer };
  }

  forget(id: number): void {
    this.pending.delete(id);
    if (this.pending.size === 0) this.sock.unref();
  }

  private onData(chunk: Buffer): void {
    let start = 0;
    for (let i = chunk.indexOf(10); i >= 0; i = chunk.indexOf(10, start)) {
      const part = chunk.subarray(start, i);
      const line = this.bufLen > 0 ? Buffer.concat([...this.buf, part]) : part;
      this.buf = [];
      this.bufLen = 0;
      start = i + 1;
      if (!this.onLine(line)) return;
    }
    if (start < chunk.length) {
      this.buf.push(chunk.subarray(start));
      this.bufLen += chunk.length - start;
      if (this.bufLen > 64 * MAX_LINE) {
        this.die(new CondfsError(Codes.BAD_ANSWER, `condfs daemon at ${this.socketPath}: an answer over ${64 * MAX_LINE} bytes`));
      }
    }
  }

  /** Handles one answer line; false once the connection is dead. */
  private onLine(line: Buffer): boolean {
    let msg: { jsonrpc?: unknown; id?: unknown; result?: unknown; error?: { code?: unknown; message?: unknown; data?: unknown } };
    try {
      msg = JSON.parse(line.toString("utf8"));
    } catch (e) {
      this.die(new CondfsError(Codes.BAD_ANSWER, `condfs daemon at ${this.socketPath}: an answer that is not JSON: ${String(e)}`));
      return false;
    }
    if (typeof msg !== "object" || msg === null || msg.jsonrpc !== "2.0") {
      this.die(new CondfsError(Codes.BAD_ANSWER, `condfs daemon at ${this.socketPath}: an answer that is not JSON-RPC 2.0`));
      return false;
    }
    let err: CondfsError | undefined;
    if (msg.error !== undefined && msg.error !== null) {
      if (typeof msg.error.code !== "number") {
        this.die(new CondfsError(Codes.BAD_ANSWER, `condfs daemon at ${this.socketPath}: an error without a code`));
        return false;
      }
      err = new CondfsError(msg.error.code, String(msg.error.message ?? ""), msg.error.data);
    } else if (!("result" in msg)) {
      this.die(new CondfsError(Codes.BAD_ANSWER, `condfs daemon at ${this.socketPath}: an answer with neither result nor error`));
      return false;
    }
    if (msg.id === null || msg.id === undefined) {
      // The daemon's word on the whole connection (a refused peer, no
      // slot left, a line it could not read) before it closes it.
      this.die(err);
      return false;
    }
    const p = typeof msg.id === "number" ? this.pending.get(msg.id) : undefined;
    if (p === undefined) return true; // an answer no one waits for (given up on)
    this.forget(msg.id as number);
    if (err) p.reject(err);
    else p.resolve(msg.result);
    return true;
  }

  die(why: CondfsError | undefined): void {
    if (!this.dead) this.dead = why ?? connectionError(this.socketPath, "the daemon closed the connection");
    for (const p of this.pending.values()) {
      p.reject(why ?? connectionError(this.socketPath, `the connection was closed before the answer to ${p.method}`));
    }
    this.pending.clear();
    this.sock.destroy();
  }
}

/**
 * A client of the condfs daemon's control socket (docs/control.md).
 *
 * One Client may be used by many tasks at once: they share one connection,
 * the daemon answers in order, and answers are matched to requests by id. A
 * connection the daemon closed (an idle timeout, a restart) is opened again
 * for the next request; a request whose answer was lost with it is sent again
 * once if making it twice changes nothing more (not session.open,
 * session.close or config.reload). The connection does not keep the process
 * alive while no answer is awaited.
 */
export class Client {
  readonly socketPath: string;
  readonly timeout: number | undefined;
  readonly condfs: string;
  private conn: Promise<Connection> | undefined;

  constructor(options: string | ClientOptions = {}) {
    const o = typeof options === "string" ? { socket: options } : options;
    this.socketPath = o.socket ?? defaultSocket();
    this.timeout = o.timeout;
    this.condfs = o.condfs ?? process.env.CONDFS_BIN ?? "condfs";
  }

  /** Closes the connection; the client connects again if used. */
  async close(): Promise<void> {
    const c = this.conn;
    this.conn = undefined;
    if (c) {
      try {
        (await c).die(connectionError(this.socketPath, "the client was closed"));
      } catch {
        // it never connected
      }
    }
  }

  private async connection(): Promise<Connection> {
    for (;;) {
      if (this.conn === undefined) {
        const fresh = Connection.open(this.socketPath, this.timeout);
        this.conn = fresh;
        fresh.catch(() => {
          if (this.conn === fresh) this.conn = undefined;
        });
      }
      const p = this.conn;
      const c = await p;
      if (!c.dead) return c;
      if (this.conn === p) this.conn = undefined; // the daemon closed it: open another
    }
  }

  /** Sends one request and resolves to its result; every error the daemon answers rejects with CondfsError. */
  call<M extends keyof Methods>(method: M, params: Methods[M]["params"]): Promise<Methods[M]["result"]>;
  call(method: string, params?: object): Promise<unknown>;
  async call(method: string, params: object = {}): Promise<unknown> {
    for (let attempt = 0; ; attempt++) {
      const conn = await this.connection();
      let sent: { id: number; answer: Promise<unknown> };
      try {
        sent = conn.send(method, params);
      } catch (e) {
        if (attempt === 0 && e instanceof CondfsError && e.code === Codes.CONNECTION_FAILED) continue;
        throw e;
      }
      try {
        return await this.bounded(sent.answer, method, () => conn.forget(sent.id));
      } catch (e) {
        if (attempt === 0 && REPEATABLE.has(method) && e instanceof CondfsError && e.code === Codes.CONNECTION_FAILED && conn.dead) {
          continue;
        }
        throw e;
      }
    }
  }

  private bounded<T>(p: Promise<T>, method: string, giveUp: () => void): Promise<T> {
    if (this.timeout === undefined) return p;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        giveUp();
        reject(new CondfsError(Codes.TIMED_OUT, `condfs daemon at ${this.socketPath}: no answer to ${method} within ${this.timeout} ms`));
      }, this.timeout);
      p.then(
        (v) => {
          clearTimeout(timer);
          resolve(v);
        },
        (e: unknown) => {
          clearTimeout(timer);
          reject(e);
        },
      );
    });
  }

  /** The daemon's status: version, sessions, config loads, limits, runs. */
  status(): Promise<Status> {
    return this.call("status", {});
  }

  /** The open sessions this uid may see. */
  async sessions(): Promise<SessionInfo[]> {
    return (await this.call("session.list", {})).sessions;
  }

  /**
   * Mounts a view at `mount` (absolute) for a new session in `context`, and
   * resolves once it is mounted. `owner` and `allowUids` are for root and the
   * daemon's uid; `changes` is "direct" or "staged" (docs/changes.md), sent
   * only when given.
   */
  async openSession(
    id: string,
    mount: string,
    context: Context,
    options: { owner?: number; allowUids?: number[]; changes?: "direct" | "staged" } = {},
  ): Promise<Session> {
    const params: SessionOpenParams = { id, mount, context };
    if (options.owner !== undefined) params.owner = options.owner;
    if (options.allowUids !== undefined) params.allow_uids = options.allowUids;
    if (options.changes !== undefined) params.changes = options.changes;
    const res = await this.call("session.open", params);
    return new Session(this, res.id, res.mount, res.atoms);
  }

  /** A handle to an open session; sends nothing. */
  session(id: string): Session {
    return new Session(this, id, undefined, []);
  }

  /** A tool call decided without a session: in `context` if given, else with when() unknown. A deny is a result. */
  decide(tool: string, args: Record<string, unknown> = {}, options: DecideOptions & { context?: Context } = {}): Promise<Decision> {
    const p = decideParams(tool, args, options);
    if (options.context !== undefined) p.context = options.context;
    return this.call("tool.decide", p);
  }

  /** The prompt blocks a context selects (no session needed). */
  async blocks(context: Context): Promise<Block[]> {
    return (await this.call("blocks.list", { context })).blocks;
  }

  /** A path's decision in a context (no session needed). */
  checkPath(space: Space, path: string, context: Context): Promise<PathDecision> {
    return this.call("path.check", { context, space, path });
  }

  /** The tools some call by these roles could be allowed or sent for approval. */
  async toolsCallable(tools: string[], options: { roles?: string[] } = {}): Promise<string[]> {
    const p: Methods["tools.callable"]["params"] = { tools };
    if (options.roles !== undefined) p.roles = options.roles;
    return (await this.call("tools.callable", p)).callable;
  }

  /** Reloads conditions.toml and policy.yaml now (root and the daemon's uid only). */
  reloadConfig(): Promise<ConfigStatus> {
    return this.call("config.reload", {});
  }
}

export interface DecideOptions {
  role?: string;
  roles?: string[];
  ctx?: Record<string, unknown>;
}

function decideParams(tool: string, args: Record<string, unknown>, o: DecideOptions): ToolDecideParams {
  const p: ToolDecideParams = { tool, args };
  if (o.role !== undefined) p.role = o.role;
  if (o.roles !== undefined) p.roles = o.roles;
  if (o.ctx !== undefined) p.ctx = o.ctx;
  return p;
}

/** An open session: its id, its view's mountpoint (undefined for a handle made by Client.session) and its atoms as last seen. */
export class Session {
  constructor(
    readonly client: Client,
    readonly id: string,
    public mount: string | undefined,
    public atoms: string[],
  ) {}

  /** Switches the context; resolves to its atoms once the new context is in force. */
  async setContext(context: Context): Promise<string[]> {
    this.atoms = (await this.client.call("context.set", { session: this.id, context })).atoms;
    return this.atoms;
  }

  async getContext(): Promise<string[]> {
    this.atoms = (await this.client.call("context.get", { session: this.id })).atoms;
    return this.atoms;
  }

  /** The prompt blocks the session's context selects. */
  async blocks(): Promise<Block[]> {
    return (await this.client.call("blocks.list", { session: this.id })).blocks;
  }

  /** What the view does with `path` of `space`, or whether a run may execute it (exec). */
  checkPath(space: Space, path: string): Promise<PathDecision> {
    return this.client.call("path.check", { session: this.id, space, path });
  }

  /** Makes a checkpoint: what the session changes from now can be rolled back to it. */
  checkpoint(name?: string): Promise<CheckpointCreateResult> {
    return this.client.call("checkpoint.create", name === undefined ? { session: this.id } : { session: this.id, name });
  }

  async checkpoints(): Promise<CheckpointInfo[]> {
    return (await this.client.call("checkpoint.list", { session: this.id })).checkpoints;
  }

  /** Undoes what the session changed since `checkpoint`; paths changed outside the view are conflicts unless `force`. */
  rollback(checkpoint: string, opts: { force?: boolean } = {}): Promise<RollbackResult> {
    return this.client.call("checkpoint.rollback", { session: this.id, checkpoint, force: opts.force ?? false });
  }

  diff(opts: { since?: string; content?: boolean } = {}): Promise<ChangesDiffResult> {
    return this.client.call("changes.diff", { session: this.id, ...opts });
  }

  /** Applies a staged session's changes (-32032 for a direct one). */
  commit(paths?: string[], opts: { force?: boolean } = {}): Promise<ChangesCommitResult> {
    return this.client.call("changes.commit", { session: this.id, paths: paths ?? null, force: opts.force ?? false });
  }

  /** Drops a staged session's changes (-32032 for a direct one). */
  discard(paths?: string[]): Promise<ChangesDiscardResult> {
    return this.client.call("changes.discard", { session: this.id, paths: paths ?? null });
  }

  /** A tool call decided in the session's context. A deny is a result: check `decision`. */
  decide(tool: string, args: Record<string, unknown> = {}, options: DecideOptions = {}): Promise<Decision> {
    const p = decideParams(tool, args, options);
    p.session = this.id;
    return this.client.call("tool.decide", p);
  }

  /**
   * Runs `argv` in a sandbox under the session's authority and resolves to
   * its exit code and output. Node's standard library cannot pass
   * descriptors over a Unix socket, so this starts `condfs run` (the
   * client's `condfs` option), which passes them. A run the policy denies
   * rejects with CondfsError RUN_DENIED, a command found nowhere
   * RUN_NOT_FOUND, anything else condfs could not run RUN_FAILED.
   */
  run(argv: string[], options: RunOptions = {}): Promise<RunResult> {
    return runWithCLI(this.client.condfs, this.client.socketPath, this.id, argv, options);
  }

  /**
   * Closes the session: its runs are killed and its view unmounted. `discard`
   * drops a staged session's uncommitted changes; it is sent only when true.
   */
  async close(options: { discard?: boolean } = {}): Promise<void> {
    const p: SessionCloseParams = { id: this.id };
    if (options.discard) p.discard = true;
    await this.client.call("session.close", p);
  }
}
