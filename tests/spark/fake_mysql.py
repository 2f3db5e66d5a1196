"""A fake MySQL server on 127.0.0.1 that asks the client for a local file.

It speaks just enough of the protocol for libmariadb: the handshake (no TLS, any
password), then it answers every statement with a ``LOCAL INFILE`` request (a 0xFB
packet) for ``wanted`` (or, for a ``LOAD DATA LOCAL INFILE 'name'`` statement in honest
mode, for the name the statement gave), records what the client sends back, and
replies OK. Everything received as file data is kept in ``received``.
"""

from __future__ import annotations

import re
import socket
import struct
import threading
from dataclasses import dataclass, field

CAPABILITIES = (0x1 | 0x8 | 0x80 | 0x200 | 0x2000 | 0x8000 | 0x80000)  # LOCAL_FILES = 0x80
OK = b"\x00\x00\x00\x02\x00\x00\x00"  # affected 0, insert id 0, autocommit, no warnings


@dataclass
class FakeServer:
    wanted: str  # the file the server asks for
    honest: bool = False  # LOAD statements: ask for the file they name instead
    every_statement: bool = True  # ask after every statement, else after LOAD only
    received: list[bytes] = field(default_factory=list)
    statements: list[str] = field(default_factory=list)
    client_flags: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.sock.close()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(client,), daemon=True).start()

    def _session(self, client: socket.socket) -> None:
        try:
            with client:
                self._send(client, 0, self._greeting())
                _, response = self._read(client)
                self.client_flags.append(struct.unpack("<I", response[:4])[0])
                self._send(client, 2, OK)
                while True:
                    _, command = self._read(client)
                    if not command or command[0] == 0x01:  # COM_QUIT
                        return
                    if command[0] != 0x03:  # not COM_QUERY (ping...): OK
                        self._send(client, 1, OK)
                        continue
                    self._query(client, command[1:].decode("utf-8", "replace"))
        except (OSError, ConnectionError):
            return

    def _query(self, client: socket.socket, statement: str) -> None:
        self.statements.append(statement)
        name = self.wanted
        named = re.match(r"\s*LOAD DATA LOCAL INFILE '([^']*)'", statement, re.I)
        if not (named or self.every_statement):
            self._send(client, 1, OK)
            return
        if self.honest and named:
            name = named.group(1)
        self._send(client, 1, b"\xfb" + name.encode())
        data = b""
        while True:  # the file's packets, then an empty one (alone: a refusal)
            _, packet = self._read(client)
            if not packet:
                break
            data += packet
        if data:
            self.received.append(data)
        self._send(client, 3, OK)

    @staticmethod
    def _greeting() -> bytes:
        scramble = b"abcdefghijklmnopqrst"
        return (b"\x0a" + b"5.7.99-fake\x00" + struct.pack("<I", 7) + scramble[:8] + b"\x00"
                + struct.pack("<H", CAPABILITIES & 0xFFFF) + b"\x2d"
                + struct.pack("<H", 0x0002) + struct.pack("<H", CAPABILITIES >> 16)
                + bytes([21]) + b"\x00" * 10 + scramble[8:] + b"\x00"
                + b"mysql_native_password\x00")

    @staticmethod
    def _send(client: socket.socket, sequence: int, payload: bytes) -> None:
        client.sendall(struct.pack("<I", len(payload))[:3] + bytes([sequence]) + payload)

    @staticmethod
    def _read(client: socket.socket) -> tuple[int, bytes]:
        header = _exactly(client, 4)
        length = int.from_bytes(header[:3], "little")
        return header[3], _exactly(client, length)


def _exactly(client: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = client.recv(n - len(data))
        if not chunk:
            raise ConnectionError("client went away")
        data += chunk
    return data
