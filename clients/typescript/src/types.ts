// The control socket's params and results, written from
// docs/control.schema.json. Each interface has the name of the schema's
// $def it mirrors; test/schema.test.mjs fails when the schema has a method
// or a field that is missing here.

/** Atoms (`["discord:dm"]`) or a description (`{kind: "tui"}`). */
export type Context = readonly string[] | ContextDescription;

/** A description the daemon derives atoms from (docs/conditions.md). */
export interface ContextDescription {
  kind: string;
  channel_id?: string;
  guild_id?: string;
  parent_id?: string;
  nsfw?: boolean;
}

export type EmptyParams = Record<string, never>;
export type EmptyResult = Record<string, never>;

export interface SessionOpenParams {
  id: string;
  mount: string;
  context: Context;
  /** The uid the view serves (root and the daemon's uid only). */
  owner?: number;
  /** Other uids let into the view (root and the daemon's uid only). */
  allow_uids?: number[] | null;
  /** direct, or staged (not available yet: refused). docs/changes.md. */
  changes?: "direct" | "staged";
}

export interface SessionOpenResult {
  id: string;
  mount: string;
  atoms: string[];
}

export interface SessionCloseParams {
  id: string;
  /** Drop a staged session's uncommitted changes. */
  discard?: boolean;
}

export interface ChangesUse {
  checkpoints: number;
  bytes: number;
  max_bytes: number;
}

export interface SessionInfo {
  id: string;
  mount: string;
  owner: number;
  atoms: string[];
  daemon_reads: number;
  changes?: ChangesUse;
}

export interface SessionListResult {
  sessions: SessionInfo[];
}

export interface ContextSetParams {
  session: string;
  context: Context;
}

export interface ContextGetParams {
  session: string;
}

export interface AtomsResult {
  atoms: string[];
}

/** session or context, not both. */
export interface BlocksListParams {
  session?: string;
  context?: Context;
}

export interface Block {
  name: string;
  description: string;
  body: string;
}

/** A selected block that could not be read; the others still load. */
export interface BlockError {
  name: string;
  file: string;
  reason: string;
}

export interface BlocksListResult {
  blocks: Block[];
  errors: BlockError[];
}

export type Space = "memories" | "workspace" | "exec";

export interface PathCheckParams {
  session?: string;
  context?: Context;
  space: Space;
  path: string;
}

export interface RuleMatch {
  key: string;
  action: "allow" | "deny";
  when: string;
  holds: boolean;
}

export interface PathDecision {
  decision: "allow" | "deny";
  path: string;
  rules: RuleMatch[];
  why: string;
}

export interface ToolDecideParams {
  session?: string;
  context?: Context;
  role?: string | null;
  roles?: string[] | null;
  tool: string;
  args?: Record<string, unknown>;
  ctx?: Record<string, unknown>;
}

export interface Decision {
  decision: "allow" | "deny" | "approval_required";
  /** The deciding role; null when none decided. */
  role: string | null;
  reasons: string[];
}

export interface RunParams {
  session: string;
  argv: string[];
  cwd?: string;
  env?: string[] | null;
  roles?: string[] | null;
  timeout_ms?: number;
  lang?: string;
  term?: string;
  tty?: boolean;
  rows?: number;
  cols?: number;
}

export interface RunAnswer {
  exit: number;
  message: string;
}

export interface RunSignalParams {
  signal: number;
}

export interface RunResizeParams {
  rows: number;
  cols: number;
}

export interface ToolsCallableParams {
  roles?: string[] | null;
  tools: string[] | null;
}

export interface ToolsCallableResult {
  callable: string[];
}

export interface FileStatus {
  path: string;
  generation: number;
  loaded_at: string;
  error: string | null;
}

export interface ConfigStatus {
  conditions: FileStatus;
  policy: FileStatus;
}

export interface Panics {
  control: number;
  fuse: number;
}

export interface Limits {
  sessions_open: number;
  max_sessions: number;
  connections: "shared" | "per-session";
}

export interface ProgramsIndex {
  covers: number;
  indexed?: string;
  error?: string;
}

export interface Protections {
  build: string;
  error?: string;
  landlock_abi: number;
  seccomp: boolean;
  programs: ProgramsIndex;
}

export interface RunsStatus {
  prepared: number;
  max_prepared: number;
  warm_starts: number;
  cold_starts: number;
  kept: number;
  discarded: number;
}

export interface EgressStatus {
  network: "none" | "host" | "policy";
  connections: number;
  max_connections: number;
  capture: string;
  stack: string;
}

export interface Status {
  version: string;
  sessions: SessionInfo[];
  config: ConfigStatus;
  panics: Panics;
  restore_errors: string[];
  limits: Limits;
  sandbox: Protections;
  runs: RunsStatus;
  egress: EgressStatus;
}

// Checkpoints and rollback (docs/changes.md).

export interface CheckpointCreateParams {
  session: string;
  name?: string;
}

export interface CheckpointCreateResult {
  id: string;
  name: string;
  /** RFC 3339. */
  created: string;
}

export interface CheckpointListParams {
  session: string;
}

export interface CheckpointInfo {
  id: string;
  name: string;
  created: string;
  changes: number;
}

export interface CheckpointListResult {
  checkpoints: CheckpointInfo[];
}

export interface CheckpointRollbackParams {
  session: string;
  checkpoint: string;
  force?: boolean;
}

export interface Conflict {
  space: Space;
  path: string;
  reason: string;
}

export interface RollbackResult {
  restored: number;
  conflicts: Conflict[];
}

export interface ChangesDiffParams {
  session: string;
  since?: string;
  content?: boolean;
}

export interface Change {
  space: Space;
  path: string;
  change: "added" | "modified" | "deleted";
  diff?: string;
  binary?: boolean;
}

export interface ChangesDiffResult {
  changes: Change[];
  hidden: number;
}

export interface ChangesCommitParams {
  session: string;
  paths?: string[] | null;
  force?: boolean;
}

export interface ChangesCommitResult {
  committed: number;
  conflicts: Conflict[];
}

export interface ChangesDiscardParams {
  session: string;
  paths?: string[] | null;
}

export interface ChangesDiscardResult {
  discarded: number;
}

/** Each socket method's params and result (the schema's `methods`). */
export interface Methods {
  "session.open": { params: SessionOpenParams; result: SessionOpenResult };
  "session.close": { params: SessionCloseParams; result: EmptyResult };
  "session.list": { params: EmptyParams; result: SessionListResult };
  "context.set": { params: ContextSetParams; result: AtomsResult };
  "context.get": { params: ContextGetParams; result: AtomsResult };
  "blocks.list": { params: BlocksListParams; result: BlocksListResult };
  "path.check": { params: PathCheckParams; result: PathDecision };
  "tool.decide": { params: ToolDecideParams; result: Decision };
  run: { params: RunParams; result: RunAnswer };
  "tools.callable": { params: ToolsCallableParams; result: ToolsCallableResult };
  "config.reload": { params: EmptyParams; result: ConfigStatus };
  status: { params: EmptyParams; result: Status };
  "checkpoint.create": { params: CheckpointCreateParams; result: CheckpointCreateResult };
  "checkpoint.list": { params: CheckpointListParams; result: CheckpointListResult };
  "checkpoint.rollback": { params: CheckpointRollbackParams; result: RollbackResult };
  "changes.diff": { params: ChangesDiffParams; result: ChangesDiffResult };
  "changes.commit": { params: ChangesCommitParams; result: ChangesCommitResult };
  "changes.discard": { params: ChangesDiscardParams; result: ChangesDiscardResult };
}

/** The lines a client may send on a run's connection while it goes on. */
export interface Notifications {
  "run.signal": { params: RunSignalParams };
  "run.resize": { params: RunResizeParams };
}

/** Which method of Client or Session sends each socket method. */
export const CLIENT_METHODS = {
  "session.open": "Client.openSession",
  "session.close": "Session.close",
  "session.list": "Client.sessions",
  "context.set": "Session.setContext",
  "context.get": "Session.getContext",
  "blocks.list": "Session.blocks",
  "path.check": "Session.checkPath",
  "tool.decide": "Session.decide",
  run: "Session.run",
  "tools.callable": "Client.toolsCallable",
  "config.reload": "Client.reloadConfig",
  status: "Client.status",
  "checkpoint.create": "Session.checkpoint",
  "checkpoint.list": "Session.checkpoints",
  "checkpoint.rollback": "Session.rollback",
  "changes.diff": "Session.diff",
  "changes.commit": "Session.commit",
  "changes.discard": "Session.discard",
} as const satisfies Record<keyof Methods, string>;
