"""CondfsError: every error the daemon answers, and every failure to reach it."""

from __future__ import annotations

import os
from typing import Any

# The daemon's codes (docs/control.md).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
UNKNOWN_SESSION = -32001
SESSION_EXISTS = -32002
MOUNT_FAILED = -32003
CONFIG_ERROR = -32004
REFUSED = -32010
NOT_OWNER = -32011
FORBIDDEN = -32012
TOO_MANY = -32013
RUN_DENIED = -32020
RUN_NOT_FOUND = -32021
UNCOMMITTED = -32030
UNKNOWN_CHECKPOINT = -32031
NOT_STAGED = -32032

# The client's own codes, for what never reached an answer. They are in no
# range the daemon answers with.
CONNECTION_FAILED = -32099
"""The socket could not be reached, or the connection was lost before the
answer; ``data`` holds ``socket`` and, where there was one, ``errno``."""
TIMED_OUT = -32098
"""No answer came within the client's timeout."""
BAD_ANSWER = -32097
"""The daemon answered something that is not a JSON-RPC answer."""


class CondfsError(Exception):
    """An error the daemon answered (``code`` is its JSON-RPC code), or a
    failure to reach it (``CONNECTION_FAILED``, ``TIMED_OUT``,
    ``BAD_ANSWER``). A decision of ``deny`` is a result, never this."""

    code: int
    message: str
    data: Any

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.message = message
        self.data = data

    def __repr__(self) -> str:
        return f"CondfsError({self.code!r}, {self.message!r}, {self.data!r})"


def connection_error(socket_path: str, what: str, err: BaseException | None = None) -> CondfsError:
    """A CONNECTION_FAILED error naming the socket."""
    data: dict[str, Any] = {"socket": socket_path}
    detail = ""
    if isinstance(err, OSError) and err.errno is not None:
        data["errno"] = err.errno
        detail = f": {os.strerror(err.errno)}"
    elif err is not None:
        detail = f": {err}"
    return CondfsError(CONNECTION_FAILED, f"condfs daemon at {socket_path}: {what}{detail}", data)
