"""What the sync and async clients share: the socket's path, the request
lines, the reading of answers, and the params of each method."""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ._errors import BAD_ANSWER, CondfsError, connection_error
from ._types import Context

MAX_LINE = 1 << 20
"""The daemon refuses a request line over 1 MiB (and closes the connection)."""

# Methods that change nothing, or that leave the same state when made twice:
# one whose connection was lost before its answer is sent again once, on a
# new connection. session.open, session.close and config.reload are not.
REPEATABLE = frozenset(
    {
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
    }
)


def default_socket() -> str:
    """$CONDFS_SOCKET, else the daemon's default path for this user:
    /run/condfs/condfs.sock for root, $XDG_RUNTIME_DIR/condfs/condfs.sock,
    else condfs-UID/condfs.sock under the temporary directory."""
    env = os.environ.get("CONDFS_SOCKET")
    if env:
        return env
    if os.geteuid() == 0:
        return "/run/condfs/condfs.sock"
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return os.path.join(xdg, "condfs", "condfs.sock")
    return os.path.join(tempfile.gettempdir(), f"condfs-{os.geteuid()}", "condfs.sock")


def request_line(req_id: int | None, method: str, params: Mapping[str, Any]) -> bytes:
    req: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if req_id is not None:
        req["id"] = req_id
    line = json.dumps(req, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    if len(line) - 1 > MAX_LINE:
        raise CondfsError(
            -32600, f"{method}: the request is {len(line) - 1} bytes, over the daemon's {MAX_LINE}-byte line limit"
        )
    return line


@dataclass
class Answer:
    """One line the daemon sent: the answer to ``id``, or (``id`` None) its
    word on the whole connection before closing it."""

    id: Any
    result: Any
    error: CondfsError | None


def parse_answer(line: bytes, socket_path: str) -> Answer:
    try:
        decoded: Any = json.loads(line)
    except ValueError as e:
        raise CondfsError(BAD_ANSWER, f"condfs daemon at {socket_path}: an answer that is not JSON: {e}") from None
    if not isinstance(decoded, dict):
        raise CondfsError(BAD_ANSWER, f"condfs daemon at {socket_path}: an answer that is not JSON-RPC 2.0")
    msg = cast("dict[str, Any]", decoded)
    if msg.get("jsonrpc") != "2.0":
        raise CondfsError(BAD_ANSWER, f"condfs daemon at {socket_path}: an answer that is not JSON-RPC 2.0")
    err: Any = msg.get("error")
    if err is not None:
        if not isinstance(err, dict):
            raise CondfsError(BAD_ANSWER, f"condfs daemon at {socket_path}: an error without a code")
        e = cast("dict[str, Any]", err)
        code = e.get("code")
        if not isinstance(code, int):
            raise CondfsError(BAD_ANSWER, f"condfs daemon at {socket_path}: an error without a code")
        return Answer(msg.get("id"), None, CondfsError(code, str(e.get("message", "")), e.get("data")))
    if "result" not in msg:
        raise CondfsError(BAD_ANSWER, f"condfs daemon at {socket_path}: an answer with neither result nor error")
    return Answer(msg.get("id"), msg["result"], None)


def refused(socket_path: str, err: OSError) -> CondfsError:
    return connection_error(socket_path, "cannot connect (is condfs serve running, and may this user use its socket?)", err)


def daemon_word(sock: socket.socket, socket_path: str) -> CondfsError | None:
    """The error line a daemon wrote before closing a connection whose
    request could not be sent (a refused peer, no slot), if it wrote one."""
    try:
        sock.settimeout(1.0)
        line = sock.recv(65536).split(b"\n", 1)[0]
        return parse_answer(line, socket_path).error if line else None
    except (OSError, CondfsError):
        return None


def lost(socket_path: str, method: str) -> CondfsError:
    return connection_error(socket_path, f"the connection was closed before the answer to {method}")


# --- params ----------------------------------------------------------------


def context_value(context: Context) -> Any:
    if isinstance(context, Mapping):
        return dict(context)
    if isinstance(context, (str, bytes)):
        raise TypeError("a context is a sequence of atoms or a description mapping, not a string")
    return list(context)


def open_params(
    id: str,
    mount: str | os.PathLike[str],
    context: Context,
    owner: int | None,
    allow_uids: Sequence[int] | None,
    changes: Any,
) -> dict[str, Any]:
    p: dict[str, Any] = {"id": id, "mount": os.fspath(mount), "context": context_value(context)}
    if owner is not None:
        p["owner"] = owner
    if allow_uids is not None:
        p["allow_uids"] = list(allow_uids)
    if changes is not None:
        # The changes layer's parameter (docs/control.md); a daemon
        # without it answers invalid params (-32602).
        p["changes"] = changes
    return p


def decide_params(
    tool: str,
    args: Mapping[str, Any] | None,
    role: str | None,
    roles: Sequence[str] | None,
    ctx: Mapping[str, Any] | None,
    session: str | None = None,
    context: Context | None = None,
) -> dict[str, Any]:
    p: dict[str, Any] = {"tool": tool, "args": dict(args) if args is not None else {}}
    if role is not None:
        p["role"] = role
    if roles is not None:
        p["roles"] = list(roles)
    if ctx is not None:
        p["ctx"] = dict(ctx)
    if session is not None:
        p["session"] = session
    if context is not None:
        p["context"] = context_value(context)
    return p


def run_params(
    session: str,
    argv: Sequence[str],
    cwd: str | None,
    env: Mapping[str, str] | Sequence[str] | None,
    timeout: float | None,
    role: str | None,
    roles: Sequence[str] | None,
) -> dict[str, Any]:
    if isinstance(argv, (str, bytes)):
        raise TypeError("argv is a sequence of strings, not one string")
    p: dict[str, Any] = {"session": session, "argv": list(argv)}
    if cwd is not None:
        p["cwd"] = cwd
    if env is not None:
        if isinstance(env, Mapping):
            p["env"] = [f"{k}={v}" for k, v in env.items()]
        else:
            p["env"] = list(env)
    if timeout is not None:
        if timeout <= 0:
            raise ValueError("timeout must be positive (None: no timeout)")
        p["timeout_ms"] = max(1, int(timeout * 1000))
    rs = list(roles) if roles is not None else []
    if role is not None:
        rs.insert(0, role)
    if rs:
        p["roles"] = rs
    lang = os.environ.get("LANG")
    if lang:
        p["lang"] = lang
    return p
