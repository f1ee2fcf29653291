"""A run: the command's stdin, stdout and stderr passed to the daemon as
descriptors (SCM_RIGHTS, ``socket.send_fds``) with the request, as
``condfs run`` passes its own. No process is started here.

The daemon gives a command only pipes, terminals and /dev/null as they are
(a file or socket could be mapped executable, or carry descriptors): the
library passes /dev/null or a pipe for stdin, and pipes for stdout and
stderr, which it reads while the command runs. The connection is the run's
lifeline: closing it kills every process of the run.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import threading
from dataclasses import dataclass
from typing import Any, cast

from ._errors import BAD_ANSWER, CONNECTION_FAILED, CondfsError, connection_error
from ._wire import daemon_word, parse_answer, refused, request_line


@dataclass(frozen=True)
class RunResult:
    """What a run ended with. ``exit_code`` is as ``condfs run`` exits: the
    command's status, 128+N for signal N, 124 when its timeout killed it,
    137 when its session closed; ``message`` says why condfs ended it."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class RunCanceller:
    """Ends a run from another thread: its connection is shut down, and the
    daemon kills every process of the run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._cancelled = False

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self._cancelled:
                sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._sock is not None:
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    @property
    def cancelled(self) -> bool:
        return self._cancelled


def run_sync(
    socket_path: str,
    params: dict[str, Any],
    input: bytes | None,
    connect_timeout: float | None,
    canceller: RunCanceller | None = None,
) -> RunResult:
    line = request_line(1, "run", params)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    ours: list[int] = []  # descriptors to close at the end
    theirs: list[int] = []  # the ends sent, closed once sent
    try:
        sock.settimeout(connect_timeout if connect_timeout is not None else 5.0)
        try:
            sock.connect(socket_path)
        except OSError as e:
            raise refused(socket_path, e) from None
        sock.settimeout(None)
        if canceller is not None:
            canceller.attach(sock)
        if input is None:
            stdin = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            theirs.append(stdin)
            stdin_w = -1
        else:
            stdin, stdin_w = os.pipe2(os.O_CLOEXEC)
            theirs.append(stdin)
            ours.append(stdin_w)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        ours.append(out_r)
        theirs.append(out_w)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        ours.append(err_r)
        theirs.append(err_w)
        try:
            sent = socket.send_fds(sock, [line], [stdin, out_w, err_w])
            if sent < len(line):
                sock.sendall(line[sent:])
        except OSError as e:
            # The daemon may have said why it closed the connection (a
            # refused peer, no slot): that first.
            raise (daemon_word(sock, socket_path) or connection_error(socket_path, "cannot send the run", e)) from None
        for fd in theirs:
            os.close(fd)
        theirs.clear()
        return _serve(sock, socket_path, stdin_w, input or b"", out_r, err_r, ours, canceller)
    finally:
        for fd in theirs + ours:
            try:
                os.close(fd)
            except OSError:
                pass
        sock.close()


def _serve(
    sock: socket.socket,
    socket_path: str,
    stdin_w: int,
    data: bytes,
    out_r: int,
    err_r: int,
    ours: list[int],
    canceller: RunCanceller | None,
) -> RunResult:
    """Writes the input, reads the output and the answer, until the answer
    came and both outputs ended."""
    sel = selectors.DefaultSelector()
    try:
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, "sock")
        sel.register(out_r, selectors.EVENT_READ, "out")
        sel.register(err_r, selectors.EVENT_READ, "err")
        if stdin_w >= 0:
            os.set_blocking(stdin_w, False)
            if data:
                sel.register(stdin_w, selectors.EVENT_WRITE, "in")
            else:
                _close(stdin_w, ours)
        bufs: dict[str, list[bytes]] = {"out": [], "err": []}
        answer = bytearray()
        answered: bytes | None = None
        open_outs = 2
        pos = 0
        refused_early = False
        while not refused_early and (answered is None or open_outs > 0):
            for key, _ in sel.select():
                what = key.data
                if what == "in":
                    try:
                        pos += os.write(stdin_w, data[pos : pos + 65536])
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        pos = len(data)  # the command stopped reading
                    if pos >= len(data):
                        sel.unregister(stdin_w)
                        _close(stdin_w, ours)
                elif what in ("out", "err"):
                    fd = key.fd
                    chunk = os.read(fd, 65536)
                    if chunk:
                        bufs[what].append(chunk)
                    else:
                        sel.unregister(fd)
                        open_outs -= 1
                else:
                    try:
                        chunk = sock.recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError as e:
                        if e.errno != errno.ECONNRESET:
                            raise
                        chunk = b""
                    if chunk:
                        answer += chunk
                        if b"\n" in answer:
                            answered = bytes(answer[: answer.index(b"\n")])
                            sel.unregister(sock)
                            # Refused before it began: the daemon released
                            # the pipes, and there is no output to wait for.
                            refused_early = _error_of(answered, socket_path) is not None
                    else:
                        if canceller is not None and canceller.cancelled:
                            raise CondfsError(
                                CONNECTION_FAILED, "the run was cancelled; every process of it was killed", {"socket": socket_path}
                            )
                        raise connection_error(socket_path, "the daemon closed the run's connection before the command ended")
        assert answered is not None
        err = _error_of(answered, socket_path)
        if err is not None:
            raise err
        res: Any = parse_answer(answered, socket_path).result
        exit_code: Any = cast("dict[str, Any]", res).get("exit") if isinstance(res, dict) else None
        if not isinstance(exit_code, int):
            raise CondfsError(BAD_ANSWER, f"condfs daemon at {socket_path}: a run's answer without an exit status")
        message = str(cast("dict[str, Any]", res).get("message") or "")
        return RunResult(exit_code, b"".join(bufs["out"]), b"".join(bufs["err"]), message)
    finally:
        sel.close()


def _error_of(line: bytes, socket_path: str) -> CondfsError | None:
    return parse_answer(line, socket_path).error


def _close(fd: int, ours: list[int]) -> None:
    os.close(fd)
    ours.remove(fd)


