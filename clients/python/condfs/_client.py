"""The synchronous client: one connection shared by every thread."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping, Sequence
from typing import Any, cast

from ._errors import CONNECTION_FAILED, TIMED_OUT, CondfsError, connection_error
from ._run import RunResult, run_sync
from ._types import (
    Block,
    ChangesCommitResult,
    ChangesDiffResult,
    ChangesDiscardResult,
    CheckpointCreateResult,
    CheckpointInfo,
    ConfigStatus,
    Context,
    Decision,
    PathDecision,
    RollbackResult,
    SessionInfo,
    Space,
    Status,
)
from ._wire import (
    MAX_LINE,
    REPEATABLE,
    context_value,
    daemon_word,
    decide_params,
    default_socket,
    lost,
    open_params,
    parse_answer,
    refused,
    request_line,
    run_params,
)


class _Waiter:
    __slots__ = ("event", "result", "error")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.result: Any = None
        self.error: CondfsError | None = None


class _Connection:
    """One connection to the daemon. Requests are written whole under a
    lock and may be in flight together; the daemon answers them in order,
    and a reader thread hands each answer to the request of its id."""

    def __init__(self, path: str, connect_timeout: float | None) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self.sock.settimeout(connect_timeout if connect_timeout is not None else 5.0)
            self.sock.connect(path)
            self.sock.settimeout(None)
        except OSError as e:
            self.sock.close()
            raise refused(path, e) from None
        # lock guards pending, next_id and dead, and is never held while
        # writing: the reader takes it to hand out answers, and a writer
        # waiting for the daemon to read must not keep answers unread.
        # wlock keeps each request line whole.
        self.lock = threading.Lock()
        self.wlock = threading.Lock()
        self.pending: dict[int, tuple[_Waiter, str]] = {}
        self.next_id = 0
        self.dead: CondfsError | None = None
        self.reader = threading.Thread(target=self._read, name=f"condfs-reader {path}", daemon=True)
        self.reader.start()

    def send(self, method: str, params: Mapping[str, Any]) -> tuple[int, _Waiter]:
        """Writes one request; raises (having sent nothing) when the
        connection is dead or the write fails."""
        w = _Waiter()
        with self.lock:
            if self.dead is not None:
                raise self.dead
            self.next_id += 1
            rid = self.next_id
        line = request_line(rid, method, params)
        with self.lock:
            self.pending[rid] = (w, method)
        try:
            with self.wlock:
                self.sock.sendall(line)
        except OSError as e:
            word = daemon_word(self.sock, self.path)
            with self.lock:
                self.pending.pop(rid, None)
                self._die(word or connection_error(self.path, f"cannot send {method}", e))
                raise cast(CondfsError, self.dead) from None
        return rid, w

    def forget(self, rid: int) -> None:
        """Drops a request no one waits for any more; its answer, if it
        comes, is read and thrown away."""
        with self.lock:
            self.pending.pop(rid, None)

    def _read(self) -> None:
        f = self.sock.makefile("rb", buffering=1 << 16)
        why: CondfsError | None = None
        try:
            while True:
                line = f.readline(MAX_LINE * 64)
                if not line:
                    break
                if not line.endswith(b"\n"):
                    break  # a half line: the connection ended mid-answer
                ans = parse_answer(line, self.path)
                if ans.id is None:
                    # The daemon's word on the whole connection (a refused
                    # peer, no slot left, a line it could not read).
                    why = ans.error
                    break
                with self.lock:
                    entry = self.pending.pop(ans.id, None) if isinstance(ans.id, int) else None
                if entry is None:
                    continue  # an answer no one waits for (given up on)
                w, _ = entry
                w.result, w.error = ans.result, ans.error
                w.event.set()
        except CondfsError as e:
            why = e
        except (OSError, ValueError):
            pass
        finally:
            f.close()
        with self.lock:
            self._die(why)

    def _die(self, why: CondfsError | None) -> None:
        """Marks the connection dead and fails every request waiting on it;
        the caller holds lock."""
        if self.dead is None:
            self.dead = why or connection_error(self.path, "the daemon closed the connection")
        for w, method in self.pending.values():
            w.error = why or lost(self.path, method)
            w.result = None
            w.event.set()
        self.pending.clear()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        with self.lock:
            self._die(connection_error(self.path, "the client was closed"))
        self.reader.join()
        self.sock.close()


class Client:
    """A client of the condfs daemon's control socket (docs/control.md).

    ``socket`` defaults to $CONDFS_SOCKET, then the daemon's default path.
    ``timeout`` bounds each request in seconds (None: none); a request that
    times out raises CondfsError(TIMED_OUT) and its late answer is dropped.

    One Client may be used from many threads at once: they share one
    connection, requests are answered in order, and answers are matched to
    requests by id. A connection the daemon closed (an idle timeout, a
    restart) is opened again for the next request; a request whose answer
    was lost with it is sent again once if making it twice changes nothing
    more than once (not session.open, session.close or config.reload).
    Runs each take a connection of their own.
    """

    def __init__(self, socket: str | os.PathLike[str] | None = None, *, timeout: float | None = None) -> None:
        self.socket_path = os.fspath(socket) if socket is not None else default_socket()
        self.timeout = timeout
        self._lock = threading.Lock()
        self._conn: _Connection | None = None
        self._closed = False

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection; the client connects again if used."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _connection(self) -> _Connection:
        with self._lock:
            if self._conn is None or self._conn.dead is not None:
                old, self._conn = self._conn, None
                if old is not None:
                    old.sock.close()
                self._conn = _Connection(self.socket_path, self.timeout)
            return self._conn

    def call(self, method: str, params: Mapping[str, Any] | None = None) -> Any:
        """Sends one request and returns its result; every error the daemon
        answers raises CondfsError with its code."""
        params = params if params is not None else {}
        for attempt in (0, 1):
            conn = self._connection()
            try:
                rid, w = conn.send(method, params)
            except CondfsError as e:
                if attempt == 0 and e.code not in (-32010, -32013):
                    continue  # nothing was sent: the daemon had closed it
                raise
            if not w.event.wait(self.timeout):
                conn.forget(rid)
                raise CondfsError(
                    TIMED_OUT, f"condfs daemon at {self.socket_path}: no answer to {method} within {self.timeout}s"
                )
            if w.error is not None:
                if attempt == 0 and method in REPEATABLE and _was_lost(w.error, conn):
                    continue
                raise w.error
            return w.result
        raise AssertionError("unreachable")

    # --- the surface ------------------------------------------------------

    def status(self) -> Status:
        """The daemon's status: version, sessions, config loads, limits, runs."""
        return cast(Status, self.call("status"))

    def sessions(self) -> list[SessionInfo]:
        """The open sessions this uid may see."""
        return cast("list[SessionInfo]", self.call("session.list")["sessions"])

    def open_session(
        self,
        id: str,
        mount: str | os.PathLike[str],
        context: Context,
        *,
        owner: int | None = None,
        allow_uids: Sequence[int] | None = None,
        changes: Any = None,
    ) -> Session:
        """Mounts a view at ``mount`` (absolute) for a new session in
        ``context`` and returns once it is mounted. ``owner`` and
        ``allow_uids`` are for root and the daemon's uid. ``changes`` is the
        changes layer's parameter, sent only when given (a daemon without
        it answers -32602)."""
        res = self.call("session.open", open_params(id, mount, context, owner, allow_uids, changes))
        return Session(self, res["id"], res["mount"], list(res["atoms"]))

    def session(self, id: str) -> Session:
        """A handle to an open session; sends nothing."""
        return Session(self, id, None, [])

    def decide(
        self,
        tool: str,
        args: Mapping[str, Any] | None = None,
        *,
        role: str | None = None,
        roles: Sequence[str] | None = None,
        ctx: Mapping[str, Any] | None = None,
        context: Context | None = None,
    ) -> Decision:
        """A tool call decided without a session: in ``context`` if given,
        else with ``when()`` unknown. A deny is a result."""
        return cast(Decision, self.call("tool.decide", decide_params(tool, args, role, roles, ctx, context=context)))

    def blocks(self, context: Context) -> list[Block]:
        """The prompt blocks a context selects (no session needed)."""
        return cast("list[Block]", self.call("blocks.list", {"context": context_value(context)})["blocks"])

    def check_path(self, space: Space, path: str, context: Context) -> PathDecision:
        """A path's decision in a context (no session needed)."""
        return cast(PathDecision, self.call("path.check", {"context": context_value(context), "space": space, "path": path}))

    def tools_callable(self, tools: Sequence[str], *, roles: Sequence[str] | None = None) -> list[str]:
        """The tools some call by these roles could be allowed or sent for
        approval (constraints are not evaluated)."""
        p: dict[str, Any] = {"tools": list(tools)}
        if roles is not None:
            p["roles"] = list(roles)
        return cast("list[str]", self.call("tools.callable", p)["callable"])

    def reload_config(self) -> ConfigStatus:
        """Reloads conditions.toml and policy.yaml now (root and the
        daemon's uid only)."""
        return cast(ConfigStatus, self.call("config.reload"))


def _was_lost(err: CondfsError, conn: _Connection) -> bool:
    return err.code == CONNECTION_FAILED and conn.dead is not None


class Session:
    """An open session: its id, its view's mountpoint (None for a handle
    made by Client.session) and its atoms as last seen."""

    def __init__(self, client: Client, id: str, mount: str | None, atoms: list[str]) -> None:
        self.client = client
        self.id = id
        self.mount = mount
        self.atoms = atoms

    def __repr__(self) -> str:
        return f"Session(id={self.id!r}, mount={self.mount!r}, atoms={self.atoms!r})"

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_context(self, context: Context) -> list[str]:
        """Switches the session's context; returns its atoms once the new
        context is in force (caches dropped, denied open files cut off)."""
        self.atoms = list(self.client.call("context.set", {"session": self.id, "context": context_value(context)})["atoms"])
        return self.atoms

    def get_context(self) -> list[str]:
        self.atoms = list(self.client.call("context.get", {"session": self.id})["atoms"])
        return self.atoms

    def blocks(self) -> list[Block]:
        """The prompt blocks the session's context selects."""
        return cast("list[Block]", self.client.call("blocks.list", {"session": self.id})["blocks"])

    def check_path(self, space: Space, path: str) -> PathDecision:
        """What the view does with ``path`` of ``space`` (memories,
        workspace), or whether a run may execute it (exec)."""
        return cast(PathDecision, self.client.call("path.check", {"session": self.id, "space": space, "path": path}))

    def decide(
        self,
        tool: str,
        args: Mapping[str, Any] | None = None,
        *,
        role: str | None = None,
        roles: Sequence[str] | None = None,
        ctx: Mapping[str, Any] | None = None,
    ) -> Decision:
        """A tool call decided in the session's context. A deny is a
        result: check ``decision["decision"]``."""
        return cast(Decision, self.client.call("tool.decide", decide_params(tool, args, role, roles, ctx, session=self.id)))

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | Sequence[str] | None = None,
        input: bytes | str | None = None,
        timeout: float | None = None,
        role: str | None = None,
        roles: Sequence[str] | None = None,
    ) -> RunResult:
        """Runs ``argv`` in a sandbox under the session's authority (its
        view, the binaries its context allows, the policy's ``exec``
        decision) and returns its exit status and output. Its stdin (``input``,
        else /dev/null), stdout and stderr are passed to the daemon as
        descriptors: no process is started here. ``timeout`` (seconds) has
        the daemon kill it (exit 124). A run the policy denies raises
        CondfsError(-32020); a command found nowhere, (-32021)."""
        data = input.encode() if isinstance(input, str) else input
        params = run_params(self.id, argv, cwd, env, timeout, role, roles)
        return run_sync(self.client.socket_path, params, data, self.client.timeout)

    def close(self, *, discard: bool = False) -> None:
        """Closes the session: its runs are killed and its view unmounted.
        ``discard`` is the changes layer's (its changes thrown away); it is
        sent only when true."""
        p: dict[str, Any] = {"id": self.id}
        if discard:
            p["discard"] = True
        self.client.call("session.close", p)

    # --- checkpoints and changes (docs/changes.md) ---------------------------

    def checkpoint(self, name: str | None = None) -> CheckpointCreateResult:
        """Takes a checkpoint of the session's files (a direct session keeps
        what each path was before its first change after it)."""
        p: dict[str, Any] = {"session": self.id}
        if name is not None:
            p["name"] = name
        return cast(CheckpointCreateResult, self.client.call("checkpoint.create", p))

    def checkpoints(self) -> list[CheckpointInfo]:
        """The session's checkpoints, oldest first."""
        return cast("list[CheckpointInfo]", self.client.call("checkpoint.list", {"session": self.id})["checkpoints"])

    def rollback(self, checkpoint: str, *, force: bool = False) -> RollbackResult:
        """Restores what the session changed since ``checkpoint`` (an id or a
        name); paths changed outside the view too are conflicts unless
        ``force``."""
        p: dict[str, Any] = {"session": self.id, "checkpoint": checkpoint}
        if force:
            p["force"] = True
        return cast(RollbackResult, self.client.call("checkpoint.rollback", p))

    def diff(self, *, since: str | None = None, content: bool = False) -> ChangesDiffResult:
        """What the session changed since a checkpoint (default the oldest);
        ``content`` adds a unified diff for each text file."""
        p: dict[str, Any] = {"session": self.id}
        if since is not None:
            p["since"] = since
        if content:
            p["content"] = True
        return cast(ChangesDiffResult, self.client.call("changes.diff", p))

    def commit(self, paths: Sequence[str] | None = None, *, force: bool = False) -> ChangesCommitResult:
        """Writes a staged session's changes (``paths``, else all) to the backing tree."""
        p: dict[str, Any] = {"session": self.id}
        if paths is not None:
            p["paths"] = list(paths)
        if force:
            p["force"] = True
        return cast(ChangesCommitResult, self.client.call("changes.commit", p))

    def discard(self, paths: Sequence[str] | None = None) -> ChangesDiscardResult:
        """Drops a staged session's uncommitted changes (``paths``, else all)."""
        p: dict[str, Any] = {"session": self.id}
        if paths is not None:
            p["paths"] = list(paths)
        return cast(ChangesDiscardResult, self.client.call("changes.discard", p))
