"""The control socket's params and results, written from docs/control.schema.json.

Each TypedDict has the name of the schema's $def it mirrors, and
tests/test_schema.py fails when the schema has a method or a field that is
missing here. Optional fields are in a ``total=False`` subclass of the
required ones (``typing.NotRequired`` is Python 3.11's).
"""

from __future__ import annotations

from typing import Any, Literal, Sequence, TypedDict, Union

# --- context ---------------------------------------------------------------


class _ContextDescriptionRequired(TypedDict):
    kind: str


class ContextDescription(_ContextDescriptionRequired, total=False):
    """A description the daemon derives atoms from (docs/conditions.md)."""

    channel_id: str
    guild_id: str
    parent_id: str
    nsfw: bool


Context = Union[Sequence[str], ContextDescription]
"""Atoms (``["discord:dm"]``) or a description (``{"kind": "tui"}``)."""


class EmptyParams(TypedDict):
    pass


class EmptyResult(TypedDict):
    pass


# --- sessions --------------------------------------------------------------


class _SessionOpenParamsRequired(TypedDict):
    id: str
    mount: str
    context: Context


class SessionOpenParams(_SessionOpenParamsRequired, total=False):
    owner: int
    allow_uids: list[int] | None
    changes: Literal["direct", "staged"]


class SessionOpenResult(TypedDict):
    id: str
    mount: str
    atoms: list[str]


class _SessionCloseParamsRequired(TypedDict):
    id: str


class SessionCloseParams(_SessionCloseParamsRequired, total=False):
    discard: bool


class ChangesUse(TypedDict):
    checkpoints: int
    bytes: int
    max_bytes: int


class _SessionInfoRequired(TypedDict):
    id: str
    mount: str
    owner: int
    atoms: list[str]
    daemon_reads: int


class SessionInfo(_SessionInfoRequired, total=False):
    changes: ChangesUse


class SessionListResult(TypedDict):
    sessions: list[SessionInfo]


class ContextSetParams(TypedDict):
    session: str
    context: Context


class ContextGetParams(TypedDict):
    session: str


class AtomsResult(TypedDict):
    atoms: list[str]


# --- blocks ----------------------------------------------------------------


class BlocksListParams(TypedDict, total=False):
    session: str
    context: Context


class Block(TypedDict):
    name: str
    description: str
    body: str


class BlockError(TypedDict):
    name: str
    file: str
    reason: str


class BlocksListResult(TypedDict):
    blocks: list[Block]
    errors: list[BlockError]


# --- path and tool decisions -----------------------------------------------

Space = Literal["memories", "workspace", "exec"]


class _PathCheckParamsRequired(TypedDict):
    space: Space
    path: str


class PathCheckParams(_PathCheckParamsRequired, total=False):
    session: str
    context: Context


class RuleMatch(TypedDict):
    key: str
    action: Literal["allow", "deny"]
    when: str
    holds: bool


class PathDecision(TypedDict):
    decision: Literal["allow", "deny"]
    path: str
    rules: list[RuleMatch]
    why: str


class _ToolDecideParamsRequired(TypedDict):
    tool: str


class ToolDecideParams(_ToolDecideParamsRequired, total=False):
    session: str
    context: Context
    role: str | None
    roles: list[str] | None
    args: dict[str, Any]
    ctx: dict[str, Any]


class Decision(TypedDict):
    decision: Literal["allow", "deny", "approval_required"]
    role: str | None
    reasons: list[str]


class _ToolsCallableParamsRequired(TypedDict):
    tools: list[str] | None


class ToolsCallableParams(_ToolsCallableParamsRequired, total=False):
    roles: list[str] | None


class ToolsCallableResult(TypedDict):
    callable: list[str]


# --- runs ------------------------------------------------------------------


class _RunParamsRequired(TypedDict):
    session: str
    argv: list[str]


class RunParams(_RunParamsRequired, total=False):
    cwd: str
    env: list[str] | None
    roles: list[str] | None
    timeout_ms: int
    lang: str
    term: str
    tty: bool
    rows: int
    cols: int


class RunAnswer(TypedDict):
    exit: int
    message: str


class RunSignalParams(TypedDict):
    signal: int


class RunResizeParams(TypedDict):
    rows: int
    cols: int


# --- status ----------------------------------------------------------------


class FileStatus(TypedDict):
    path: str
    generation: int
    loaded_at: str
    error: str | None


class ConfigStatus(TypedDict):
    conditions: FileStatus
    policy: FileStatus


class Panics(TypedDict):
    control: int
    fuse: int


class Limits(TypedDict):
    sessions_open: int
    max_sessions: int
    connections: Literal["shared", "per-session"]


class _ProgramsIndexRequired(TypedDict):
    covers: int


class ProgramsIndex(_ProgramsIndexRequired, total=False):
    indexed: str
    error: str


class _ProtectionsRequired(TypedDict):
    build: str
    landlock_abi: int
    seccomp: bool
    programs: ProgramsIndex


class Protections(_ProtectionsRequired, total=False):
    error: str


class RunsStatus(TypedDict):
    prepared: int
    max_prepared: int
    warm_starts: int
    cold_starts: int
    kept: int
    discarded: int


class EgressStatus(TypedDict):
    network: Literal["none", "host", "policy"]
    connections: int
    max_connections: int
    capture: str
    stack: str


class Status(TypedDict):
    version: str
    sessions: list[SessionInfo]
    config: ConfigStatus
    panics: Panics
    restore_errors: list[str]
    limits: Limits
    sandbox: Protections
    runs: RunsStatus
    egress: EgressStatus


# --- checkpoints and changes (docs/changes.md) ------------------------------


class _CheckpointCreateParamsRequired(TypedDict):
    session: str


class CheckpointCreateParams(_CheckpointCreateParamsRequired, total=False):
    name: str


class CheckpointCreateResult(TypedDict):
    id: str
    name: str
    created: str


class CheckpointListParams(TypedDict):
    session: str


class CheckpointInfo(TypedDict):
    id: str
    name: str
    created: str
    changes: int


class CheckpointListResult(TypedDict):
    checkpoints: list[CheckpointInfo]


class _CheckpointRollbackParamsRequired(TypedDict):
    session: str
    checkpoint: str


class CheckpointRollbackParams(_CheckpointRollbackParamsRequired, total=False):
    force: bool


class Conflict(TypedDict):
    space: Space
    path: str
    reason: str


class RollbackResult(TypedDict):
    restored: int
    conflicts: list[Conflict]


class _ChangesDiffParamsRequired(TypedDict):
    session: str


class ChangesDiffParams(_ChangesDiffParamsRequired, total=False):
    since: str
    content: bool


class _ChangeRequired(TypedDict):
    space: Space
    path: str
    change: Literal["added", "modified", "deleted"]


class Change(_ChangeRequired, total=False):
    diff: str
    binary: bool


class ChangesDiffResult(TypedDict):
    changes: list[Change]
    hidden: int


class _ChangesCommitParamsRequired(TypedDict):
    session: str


class ChangesCommitParams(_ChangesCommitParamsRequired, total=False):
    paths: list[str] | None
    force: bool


class ChangesCommitResult(TypedDict):
    committed: int
    conflicts: list[Conflict]


class _ChangesDiscardParamsRequired(TypedDict):
    session: str


class ChangesDiscardParams(_ChangesDiscardParamsRequired, total=False):
    paths: list[str] | None


class ChangesDiscardResult(TypedDict):
    discarded: int


METHODS: dict[str, tuple[type, type]] = {
    "session.open": (SessionOpenParams, SessionOpenResult),
    "session.close": (SessionCloseParams, EmptyResult),
    "session.list": (EmptyParams, SessionListResult),
    "context.set": (ContextSetParams, AtomsResult),
    "context.get": (ContextGetParams, AtomsResult),
    "blocks.list": (BlocksListParams, BlocksListResult),
    "path.check": (PathCheckParams, PathDecision),
    "tool.decide": (ToolDecideParams, Decision),
    "run": (RunParams, RunAnswer),
    "tools.callable": (ToolsCallableParams, ToolsCallableResult),
    "config.reload": (EmptyParams, ConfigStatus),
    "status": (EmptyParams, Status),
    "checkpoint.create": (CheckpointCreateParams, CheckpointCreateResult),
    "checkpoint.list": (CheckpointListParams, CheckpointListResult),
    "checkpoint.rollback": (CheckpointRollbackParams, RollbackResult),
    "changes.diff": (ChangesDiffParams, ChangesDiffResult),
    "changes.commit": (ChangesCommitParams, ChangesCommitResult),
    "changes.discard": (ChangesDiscardParams, ChangesDiscardResult),
}
"""Each socket method's params and result types (the schema's ``methods``)."""

NOTIFICATIONS: dict[str, type] = {
    "run.signal": RunSignalParams,
    "run.resize": RunResizeParams,
}
"""The lines a client may send on a run's connection while it goes on."""

CLIENT_METHODS: dict[str, str] = {
    "session.open": "Client.open_session",
    "session.close": "Session.close",
    "session.list": "Client.sessions",
    "context.set": "Session.set_context",
    "context.get": "Session.get_context",
    "blocks.list": "Session.blocks",
    "path.check": "Session.check_path",
    "tool.decide": "Session.decide",
    "run": "Session.run",
    "tools.callable": "Client.tools_callable",
    "config.reload": "Client.reload_config",
    "status": "Client.status",
    "checkpoint.create": "Session.checkpoint",
    "checkpoint.list": "Session.checkpoints",
    "checkpoint.rollback": "Session.rollback",
    "changes.diff": "Session.diff",
    "changes.commit": "Session.commit",
    "changes.discard": "Session.discard",
}
"""Which method of Client or Session sends each socket method (and the same
names on AsyncClient and AsyncSession)."""
