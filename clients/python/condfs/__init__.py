"""condfs: a client of the condfs daemon's control socket.

Sessions (a view of memories/ and workspace/ that follows a context), the
context itself, prompt blocks, path and tool decisions, and commands run
in a sandbox under a session's authority, from the runtime's own process::

    from condfs import Client

    client = Client()                         # $CONDFS_SOCKET or the default socket
    s = client.open_session("alice-dm", "/run/agent/alice", ["discord:dm"])
    s.set_context({"kind": "discord", "channel_id": "7", "guild_id": "9"})
    if s.decide("web_fetch", {"url": url})["decision"] == "allow": ...
    r = s.run(["ls", "/memories"])            # stdio passed as descriptors
    print(r.exit_code, r.stdout.decode())

Every error the daemon answers raises CondfsError with its code; a deny is
a result. AsyncClient has the same methods as coroutines.
"""

from ._aio import AsyncClient, AsyncSession
from ._client import Client, Session
from ._errors import (
    BAD_ANSWER,
    CONFIG_ERROR,
    CONNECTION_FAILED,
    FORBIDDEN,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    MOUNT_FAILED,
    NOT_OWNER,
    PARSE_ERROR,
    REFUSED,
    RUN_DENIED,
    RUN_NOT_FOUND,
    SESSION_EXISTS,
    TIMED_OUT,
    TOO_MANY,
    UNCOMMITTED,
    UNKNOWN_CHECKPOINT,
    UNKNOWN_SESSION,
    NOT_STAGED,
    CondfsError,
)
from ._run import RunResult
from ._types import (
    Block,
    BlockError,
    ConfigStatus,
    Context,
    ContextDescription,
    Decision,
    FileStatus,
    PathDecision,
    RuleMatch,
    SessionInfo,
    Space,
    Status,
)
from ._wire import default_socket

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AsyncSession",
    "Client",
    "Session",
    "CondfsError",
    "RunResult",
    "Block",
    "BlockError",
    "ConfigStatus",
    "Context",
    "ContextDescription",
    "Decision",
    "FileStatus",
    "PathDecision",
    "RuleMatch",
    "SessionInfo",
    "Space",
    "Status",
    "default_socket",
    "BAD_ANSWER",
    "CONFIG_ERROR",
    "CONNECTION_FAILED",
    "FORBIDDEN",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "MOUNT_FAILED",
    "NOT_OWNER",
    "PARSE_ERROR",
    "REFUSED",
    "RUN_DENIED",
    "RUN_NOT_FOUND",
    "SESSION_EXISTS",
    "TIMED_OUT",
    "TOO_MANY",
    "UNCOMMITTED",
    "UNKNOWN_CHECKPOINT",
    "UNKNOWN_SESSION",
    "NOT_STAGED",
]
