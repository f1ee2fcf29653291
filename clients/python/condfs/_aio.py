"""The asyncio client: the same surface as Client, as coroutines."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

from ._errors import CONNECTION_FAILED, TIMED_OUT, CondfsError, connection_error
from ._run import RunCanceller, RunResult, run_sync
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
    decide_params,
    default_socket,
    lost,
    open_params,
    parse_answer,
    refused,
    request_line,
    run_params,
)


class _AsyncConnection:
    """One connection; a reader task hands each answer to the request of its id."""

    def __init__(self, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.path = path
        self.reader = reader
        self.writer = writer
        self.write_lock = asyncio.Lock()
        self.pending: dict[int, tuple[asyncio.Future[Any], str]] = {}
        self.next_id = 0
        self.dead: CondfsError | None = None
        self.task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def open(cls, path: str, timeout: float | None) -> _AsyncConnection:
        try:
            r, w = await asyncio.wait_for(
                asyncio.open_unix_connection(path, limit=MAX_LINE * 64), timeout if timeout is not None else 5.0
            )
        except (OSError, asyncio.TimeoutError) as e:
            raise refused(path, e if isinstance(e, OSError) else OSError(110, "timed out")) from None
        return cls(path, r, w)

    async def send(self, method: str, params: Mapping[str, Any]) -> tuple[int, asyncio.Future[Any]]:
        async with self.write_lock:
            if self.dead is not None:
                raise self.dead
            self.next_id += 1
            rid = self.next_id
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self.pending[rid] = (fut, method)
            try:
                self.writer.write(request_line(rid, method, params))
                await self.writer.drain()
            except OSError as e:
                self.pending.pop(rid, None)
                self._die(connection_error(self.path, f"cannot send {method}", e))
                raise cast(CondfsError, self.dead) from None
            except BaseException:
                self.pending.pop(rid, None)
                raise
        return rid, fut

    async def _read(self) -> None:
        why: CondfsError | None = None
        try:
            while True:
                line = await self.reader.readline()
                if not line.endswith(b"\n"):
                    break
                ans = parse_answer(line, self.path)
                if ans.id is None:
                    why = ans.error
                    break
                entry = self.pending.pop(ans.id, None) if isinstance(ans.id, int) else None
                if entry is None or entry[0].done():
                    continue
                fut, _ = entry
                if ans.error is not None:
                    fut.set_exception(ans.error)
                else:
                    fut.set_result(ans.result)
        except CondfsError as e:
            why = e
        except (OSError, ValueError, asyncio.LimitOverrunError, asyncio.IncompleteReadError):
            pass
        self._die(why)

    def _die(self, why: CondfsError | None) -> None:
        if self.dead is None:
            self.dead = why or connection_error(self.path, "the daemon closed the connection")
        for fut, method in self.pending.values():
            if not fut.done():
                fut.set_exception(why or lost(self.path, method))
        self.pending.clear()
        self.writer.close()

    async def close(self) -> None:
        self._die(connection_error(self.path, "the client was closed"))
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass
        try:
            await self.writer.wait_closed()
        except OSError:
            pass


class AsyncClient:
    """The asyncio form of Client: the same methods, as coroutines, safe for
    many tasks at once on one connection (answers matched by id), and
    reconnecting after the daemon closed it. Use it within one event loop."""

    def __init__(self, socket: str | os.PathLike[str] | None = None, *, timeout: float | None = None) -> None:
        self.socket_path = os.fspath(socket) if socket is not None else default_socket()
        self.timeout = timeout
        self._conn: _AsyncConnection | None = None
        self._lock: asyncio.Lock | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def _connection(self) -> _AsyncConnection:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._conn is None or self._conn.dead is not None:
                self._conn = await _AsyncConnection.open(self.socket_path, self.timeout)
            return self._conn

    async def call(self, method: str, params: Mapping[str, Any] | None = None) -> Any:
        """Sends one request and returns its result (CondfsError for errors)."""
        params = params if params is not None else {}
        for attempt in (0, 1):
            conn = await self._connection()
            try:
                rid, fut = await conn.send(method, params)
            except CondfsError:
                if attempt == 0:
                    continue
                raise
            try:
                return await asyncio.wait_for(asyncio.shield(fut), self.timeout)
            except asyncio.TimeoutError:
                conn.pending.pop(rid, None)
                raise CondfsError(
                    TIMED_OUT, f"condfs daemon at {self.socket_path}: no answer to {method} within {self.timeout}s"
                ) from None
            except CondfsError as e:
                if attempt == 0 and method in REPEATABLE and e.code == CONNECTION_FAILED and conn.dead is not None:
                    continue
                raise
        raise AssertionError("unreachable")

    async def status(self) -> Status:
        return cast(Status, await self.call("status"))

    async def sessions(self) -> list[SessionInfo]:
        return cast("list[SessionInfo]", (await self.call("session.list"))["sessions"])

    async def open_session(
        self,
        id: str,
        mount: str | os.PathLike[str],
        context: Context,
        *,
        owner: int | None = None,
        allow_uids: Sequence[int] | None = None,
        changes: Any = None,
    ) -> AsyncSession:
        res = await self.call("session.open", open_params(id, mount, context, owner, allow_uids, changes))
        return AsyncSession(self, res["id"], res["mount"], list(res["atoms"]))

    def session(self, id: str) -> AsyncSession:
        return AsyncSession(self, id, None, [])

    async def decide(
        self,
        tool: str,
        args: Mapping[str, Any] | None = None,
        *,
        role: str | None = None,
        roles: Sequence[str] | None = None,
        ctx: Mapping[str, Any] | None = None,
        context: Context | None = None,
    ) -> Decision:
        return cast(Decision, await self.call("tool.decide", decide_params(tool, args, role, roles, ctx, context=context)))

    async def blocks(self, context: Context) -> list[Block]:
        return cast("list[Block]", (await self.call("blocks.list", {"context": context_value(context)}))["blocks"])

    async def check_path(self, space: Space, path: str, context: Context) -> PathDecision:
        return cast(PathDecision, await self.call("path.check", {"context": context_value(context), "space": space, "path": path}))

    async def tools_callable(self, tools: Sequence[str], *, roles: Sequence[str] | None = None) -> list[str]:
        p: dict[str, Any] = {"tools": list(tools)}
        if roles is not None:
            p["roles"] = list(roles)
        return cast("list[str]", (await self.call("tools.callable", p))["callable"])

    async def reload_config(self) -> ConfigStatus:
        return cast(ConfigStatus, await self.call("config.reload"))


class AsyncSession:
    """The asyncio form of Session."""

    def __init__(self, client: AsyncClient, id: str, mount: str | None, atoms: list[str]) -> None:
        self.client = client
        self.id = id
        self.mount = mount
        self.atoms = atoms

    def __repr__(self) -> str:
        return f"AsyncSession(id={self.id!r}, mount={self.mount!r}, atoms={self.atoms!r})"

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def set_context(self, context: Context) -> list[str]:
        res = await self.client.call("context.set", {"session": self.id, "context": context_value(context)})
        self.atoms = list(res["atoms"])
        return self.atoms

    async def get_context(self) -> list[str]:
        self.atoms = list((await self.client.call("context.get", {"session": self.id}))["atoms"])
        return self.atoms

    async def blocks(self) -> list[Block]:
        return cast("list[Block]", (await self.client.call("blocks.list", {"session": self.id}))["blocks"])

    async def check_path(self, space: Space, path: str) -> PathDecision:
        return cast(PathDecision, await self.client.call("path.check", {"session": self.id, "space": space, "path": path}))

    async def decide(
        self,
        tool: str,
        args: Mapping[str, Any] | None = None,
        *,
        role: str | None = None,
        roles: Sequence[str] | None = None,
        ctx: Mapping[str, Any] | None = None,
    ) -> Decision:
        return cast(Decision, await self.client.call("tool.decide", decide_params(tool, args, role, roles, ctx, session=self.id)))

    async def run(
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
        """As Session.run, on a worker thread (the descriptors are passed
        the same way). Cancelling the task closes the run's connection,
        and the daemon kills every process of the run."""
        data = input.encode() if isinstance(input, str) else input
        params = run_params(self.id, argv, cwd, env, timeout, role, roles)
        canceller = RunCanceller()
        work = asyncio.ensure_future(
            asyncio.to_thread(run_sync, self.client.socket_path, params, data, self.client.timeout, canceller)
        )
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            canceller.cancel()
            try:
                await work
            except (CondfsError, asyncio.CancelledError):
                pass
            raise

    async def close(self, *, discard: bool = False) -> None:
        p: dict[str, Any] = {"id": self.id}
        if discard:
            p["discard"] = True
        await self.client.call("session.close", p)

    # --- checkpoints and changes (docs/changes.md) ---------------------------

    async def checkpoint(self, name: str | None = None) -> CheckpointCreateResult:
        """Takes a checkpoint of the session's files (a direct session keeps
        what each path was before its first change after it)."""
        p: dict[str, Any] = {"session": self.id}
        if name is not None:
            p["name"] = name
        return cast(CheckpointCreateResult, await self.client.call("checkpoint.create", p))

    async def checkpoints(self) -> list[CheckpointInfo]:
        """The session's checkpoints, oldest first."""
        return cast("list[CheckpointInfo]", (await self.client.call("checkpoint.list", {"session": self.id}))["checkpoints"])

    async def rollback(self, checkpoint: str, *, force: bool = False) -> RollbackResult:
        """Restores what the session changed since ``checkpoint`` (an id or a
        name); paths changed outside the view too are conflicts unless
        ``force``."""
        p: dict[str, Any] = {"session": self.id, "checkpoint": checkpoint}
        if force:
            p["force"] = True
        return cast(RollbackResult, await self.client.call("checkpoint.rollback", p))

    async def diff(self, *, since: str | None = None, content: bool = False) -> ChangesDiffResult:
        """What the session changed since a checkpoint (default the oldest);
        ``content`` adds a unified diff for each text file."""
        p: dict[str, Any] = {"session": self.id}
        if since is not None:
            p["since"] = since
        if content:
            p["content"] = True
        return cast(ChangesDiffResult, await self.client.call("changes.diff", p))

    async def commit(self, paths: Sequence[str] | None = None, *, force: bool = False) -> ChangesCommitResult:
        """Writes a staged session's changes (``paths``, else all) to the backing tree."""
        p: dict[str, Any] = {"session": self.id}
        if paths is not None:
            p["paths"] = list(paths)
        if force:
            p["force"] = True
        return cast(ChangesCommitResult, await self.client.call("changes.commit", p))

    async def discard(self, paths: Sequence[str] | None = None) -> ChangesDiscardResult:
        """Drops a staged session's uncommitted changes (``paths``, else all)."""
        p: dict[str, Any] = {"session": self.id}
        if paths is not None:
            p["paths"] = list(paths)
        return cast(ChangesDiscardResult, await self.client.call("changes.discard", p))
