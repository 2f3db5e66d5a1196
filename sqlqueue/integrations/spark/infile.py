"""``LOAD DATA LOCAL INFILE`` served from memory, for one expected name only.

With ``local_infile`` on, libmariadb answers a server's request for a local file after
*any* statement (even the ``SET NAMES`` mysqlclient sends while connecting) and reads
whatever file the server names: a rogue server, or anyone on an unencrypted path, reads
any file the process can read. So the writer never turns it on. Its bulk connection is
opened in libmariadb's default "auto" mode (a request is refused unless the last
statement began with ``LOAD``), and before its one ``LOAD DATA`` statement a client-side
handler is installed through the C API (mysqlclient does not expose one): the handler
serves the CSV bytes from memory, once, and only under the random name that the
statement itself sent; any other name is refused without touching the file system.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import secrets
from typing import Any

from sqlqueue.exceptions import SqlqueueError

# int (*init)(void **ptr, const char *filename, void *userdata)
_INIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
                         ctypes.c_void_p)
# int (*read)(void *ptr, char *buf, unsigned int buf_len)
_READ = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)
# void (*end)(void *ptr)
_END = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# int (*error)(void *ptr, char *error_msg, unsigned int error_msg_len)
_ERROR = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)

REFUSED_CODE = 2000  # CR_UNKNOWN_ERROR, as libmariadb's own refusal


class BulkLoadUnavailable(SqlqueueError, RuntimeError):
    """The MySQL client library has no local-infile handler API (not libmariadb or
    libmysqlclient): the writer publishes through INSERT instead."""


def _client_library() -> Any:
    for name in ("mariadb", "mysqlclient"):
        found = ctypes.util.find_library(name)
        if found:
            try:
                library = ctypes.CDLL(found)
                library.mysql_set_local_infile_handler  # noqa: B018 (probe)
                return library
            except (OSError, AttributeError):
                continue
    raise BulkLoadUnavailable("no MySQL client library with mysql_set_local_infile_handler")


def _native_handle(raw: Any) -> int:
    """The ``MYSQL *`` of a mysqlclient connection (a PyCapsule)."""
    capsule = raw._get_native_connection()
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    pointer = get_pointer(capsule, b"_mysql.connection.native_connection")
    if not pointer:
        raise BulkLoadUnavailable("mysqlclient gave no native connection")
    return int(pointer)


class MemoryInfile:
    """One file's bytes, handed to the server once, under ``name`` only.

    Keep the object alive while the statement runs (the C callbacks point into it)."""

    def __init__(self, data: bytes) -> None:
        self.name = f"sqlqueue-{secrets.token_hex(16)}.csv"
        self.data = data
        self.position = 0
        self.served = False
        self.refused: list[str] = []  # names a server asked for and did not get
        self._message = b""
        # The callbacks must outlive the statement: held here.
        self._callbacks = (_INIT(self._init), _READ(self._read), _END(self._end),
                           _ERROR(self._error))

    def install(self, raw: Any) -> None:
        """Make this the handler of the mysqlclient connection ``raw``."""
        library = _client_library()
        setter = library.mysql_set_local_infile_handler
        setter.restype = None
        setter.argtypes = [ctypes.c_void_p, _INIT, _READ, _END, _ERROR, ctypes.c_void_p]
        setter(_native_handle(raw), *self._callbacks, None)

    def _init(self, ptr: Any, filename: bytes | None, userdata: Any) -> int:
        name = (filename or b"").decode("utf-8", "replace")
        if self.served or name != self.name:
            self.refused.append(name)
            self._message = f"sqlqueue refuses to send local file {name[:64]!r}".encode()
            return 1
        self.served = True
        return 0

    def _read(self, ptr: Any, buffer: int, length: int) -> int:
        chunk = self.data[self.position:self.position + length]
        ctypes.memmove(buffer, chunk, len(chunk))
        self.position += len(chunk)
        return len(chunk)

    def _end(self, ptr: Any) -> None:
        return None

    def _error(self, ptr: Any, buffer: int, length: int) -> int:
        message = self._message[:max(length - 1, 0)] + b"\0"
        ctypes.memmove(buffer, message, len(message))
        return REFUSED_CODE
