// @condfs/client: a client of the condfs daemon's control socket.
export { Client, Session, defaultSocket, MAX_LINE, type ClientOptions, type DecideOptions } from "./client.js";
export { CondfsError, Codes } from "./errors.js";
export type { RunOptions, RunResult } from "./run.js";
export * from "./types.js";
