/** The daemon's JSON-RPC error codes (docs/control.md). */
export const Codes = {
  PARSE_ERROR: -32700,
  INVALID_REQUEST: -32600,
  METHOD_NOT_FOUND: -32601,
  INVALID_PARAMS: -32602,
  INTERNAL_ERROR: -32603,
  UNKNOWN_SESSION: -32001,
  SESSION_EXISTS: -32002,
  MOUNT_FAILED: -32003,
  CONFIG_ERROR: -32004,
  REFUSED: -32010,
  NOT_OWNER: -32011,
  FORBIDDEN: -32012,
  TOO_MANY: -32013,
  RUN_DENIED: -32020,
  RUN_NOT_FOUND: -32021,
  UNCOMMITTED: -32030,
  UNKNOWN_CHECKPOINT: -32031,
  NOT_STAGED: -32032,
  // The client's own, for what never reached an answer; in no range the
  // daemon answers with.
  /** The socket could not be reached, or the connection was lost before the answer. */
  CONNECTION_FAILED: -32099,
  /** No answer within the client's timeout. */
  TIMED_OUT: -32098,
  /** The daemon answered something that is not a JSON-RPC answer. */
  BAD_ANSWER: -32097,
  /**
   * `condfs run` (which Session.run starts) could not run the command and
   * exited 125 with a message whose daemon code it does not print.
   */
  RUN_FAILED: -32096,
} as const;

/**
 * An error the daemon answered (`code` is its JSON-RPC code), or a failure
 * to reach it. A decision of `deny` is a result, never this.
 */
export class CondfsError extends Error {
  readonly code: number;
  readonly data: unknown;

  constructor(code: number, message: string, data?: unknown) {
    super(message);
    this.name = "CondfsError";
    this.code = code;
    this.data = data;
  }
}

export function connectionError(socket: string, what: string, err?: NodeJS.ErrnoException | Error): CondfsError {
  const data: { socket: string; errno?: string } = { socket };
  let detail = "";
  if (err !== undefined) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== undefined) data.errno = code;
    detail = `: ${code ?? err.message}`;
  }
  return new CondfsError(Codes.CONNECTION_FAILED, `condfs daemon at ${socket}: ${what}${detail}`, data);
}
