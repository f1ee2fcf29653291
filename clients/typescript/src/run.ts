// Session.run: Node's standard library cannot pass descriptors over a Unix
// socket (SCM_RIGHTS), so a run starts `condfs run`, which passes its own
// stdio to the daemon with the request. Its exit status is the command's,
// and its own refusals are one line on stderr, read back here as
// CondfsError.

import { spawn } from "node:child_process";

import { Codes, CondfsError, connectionError } from "./errors.js";

export interface RunOptions {
  /** Working directory in the sandbox, under /workspace or /memories (default /workspace). */
  cwd?: string;
  /** Added to the command's environment (which is not inherited). */
  env?: Record<string, string> | string[];
  /** The command's stdin (default: /dev/null). */
  input?: string | Uint8Array;
  /** Has the daemon kill every process of the run after this many milliseconds (exit 124). */
  timeout?: number;
  /** The caller's role for the policy's `exec` decision. */
  role?: string;
  roles?: string[];
  /** Aborting kills every process of the run (and rejects with an AbortError). */
  signal?: AbortSignal;
}

/**
 * What a run ended with. `exitCode` is as `condfs run` exits: the command's
 * status, 128+N for signal N, 124 when its timeout killed it, 137 when its
 * session closed; `message` says why condfs ended it, if it did.
 */
export interface RunResult {
  exitCode: number;
  stdout: Buffer;
  stderr: Buffer;
  message: string;
}

const PREFIX = "condfs run: ";

export function runWithCLI(
  condfs: string,
  socket: string,
  session: string,
  argv: string[],
  o: RunOptions,
): Promise<RunResult> {
  if (!Array.isArray(argv) || argv.length === 0) {
    return Promise.reject(new CondfsError(Codes.INVALID_PARAMS, "run: argv must be a non-empty array of strings"));
  }
  const args = ["run", "--socket", socket, "--session", session];
  if (o.cwd !== undefined) args.push("--cwd", o.cwd);
  const env = Array.isArray(o.env) ? o.env : Object.entries(o.env ?? {}).map(([k, v]) => `${k}=${v}`);
  for (const e of env) args.push("--env", e);
  if (o.timeout !== undefined) {
    if (!(o.timeout > 0)) return Promise.reject(new CondfsError(Codes.INVALID_PARAMS, "run: timeout must be positive (ms)"));
    args.push("--timeout", `${Math.max(1, Math.round(o.timeout))}ms`);
  }
  for (const r of [...(o.role !== undefined ? [o.role] : []), ...(o.roles ?? [])]) args.push("--role", r);
  args.push("--", ...argv);
  return new Promise((resolve, reject) => {
    const child = spawn(condfs, args, {
      stdio: [o.input === undefined ? "ignore" : "pipe", "pipe", "pipe"],
      signal: o.signal,
      killSignal: "SIGTERM", // condfs run ends the run (closes its connection) and exits
    });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout?.on("data", (b: Buffer) => out.push(b));
    child.stderr?.on("data", (b: Buffer) => err.push(b));
    let failed: Error | undefined;
    child.on("error", (e: NodeJS.ErrnoException) => {
      if (e.name === "AbortError") failed = e;
      else if (e.code === "ENOENT") {
        failed = new CondfsError(Codes.RUN_FAILED, `cannot start ${condfs} (condfs run): not found; install condfs or set CONDFS_BIN`, {
          condfs,
        });
      } else failed = failed ?? e;
    });
    if (o.input !== undefined && child.stdin) {
      child.stdin.on("error", () => {
        // EPIPE: the command read none or part of its input
      });
      child.stdin.end(typeof o.input === "string" ? Buffer.from(o.input) : o.input);
    }
    child.on("close", (code, sig) => {
      if (failed) return reject(failed);
      const stdout = Buffer.concat(out);
      const stderr = Buffer.concat(err);
      if (code === null) {
        return reject(new CondfsError(Codes.RUN_FAILED, `condfs run was killed by ${sig ?? "a signal"}`, { socket }));
      }
      const own = ownLine(stderr);
      if (own !== undefined && stdout.length === 0 && own.whole && (code === 125 || code === 126 || code === 127)) {
        return reject(refusal(code, own.message, socket));
      }
      let message = "";
      let rest = stderr;
      if (own !== undefined && (code === 124 || code === 137)) {
        message = own.message;
        rest = stderr.subarray(0, stderr.length - own.bytes);
      }
      resolve({ exitCode: code, stdout, stderr: rest, message });
    });
  });
}

/** The last line of stderr when it is condfs run's own ("condfs run: ..."). */
function ownLine(stderr: Buffer): { message: string; bytes: number; whole: boolean } | undefined {
  if (stderr.length === 0 || stderr[stderr.length - 1] !== 10) return undefined;
  const start = stderr.lastIndexOf(10, stderr.length - 2) + 1;
  const line = stderr.subarray(start, stderr.length - 1).toString("utf8");
  if (!line.startsWith(PREFIX)) return undefined;
  return { message: line.slice(PREFIX.length), bytes: stderr.length - start, whole: start === 0 };
}

function refusal(code: number, message: string, socket: string): CondfsError {
  if (code === 126) return new CondfsError(Codes.RUN_DENIED, message, { exit: code });
  if (code === 127) return new CondfsError(Codes.RUN_NOT_FOUND, message, { exit: code });
  if (message.startsWith("unknown session")) return new CondfsError(Codes.UNKNOWN_SESSION, message, { exit: code });
  if (message.includes("belongs to another user")) return new CondfsError(Codes.NOT_OWNER, message, { exit: code });
  if (message.includes("is unreachable")) return connectionError(socket, `cannot connect (${message})`);
  return new CondfsError(Codes.RUN_FAILED, message, { exit: code });
}
