"""``--tokens`` must be a regular file: a FIFO, a socket, a device or a directory is refused, before it
is opened, with a :class:`TokensFileError` naming the path and what it is (a FIFO used to hang start-up
until something wrote to it)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason='the MCP SDK is not installed (pip install "hiermem[mcp]")')

from shared_core.serve.mcp_auth import TokensFileError, TokenTable  # noqa: E402

TOKEN = secrets.token_urlsafe(32)
posix_only = pytest.mark.skipif(os.name != "posix", reason="FIFOs and Unix sockets are POSIX")


class _Writer(threading.Thread):
    """Opens a FIFO for writing (which waits for a reader) and writes a valid tokens file into it: a
    loader that opens the FIFO would read it and succeed."""

    def __init__(self, fifo: Path) -> None:
        super().__init__(daemon=True)
        self.fifo = fifo

    def run(self) -> None:
        with open(self.fifo, "w", encoding="utf-8") as f:
            f.write(json.dumps({TOKEN: ["alice"]}))  # fits in the pipe's buffer: never waits

    def release(self) -> None:
        """Let the writer through, whether or not it already waits for a reader (a reader stays open
        until it is done), then wait for it."""
        fd = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            self.join()
        finally:
            os.close(fd)


def _refused_with_a_writer(path: Path, fifo: Path) -> str:
    """Load ``path`` (``fifo`` or a link to it) while a writer waits to fill ``fifo``: the message of the
    refusal (a loader that opened the FIFO would get a valid file and no error)."""
    writer = _Writer(fifo)
    writer.start()
    try:
        with pytest.raises(TokensFileError) as info:
            TokenTable.load(path)
    finally:
        writer.release()
    return str(info.value)


@posix_only
def test_a_fifo_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "tokens.json"
    os.mkfifo(fifo)
    msg = _refused_with_a_writer(fifo, fifo)
    assert str(fifo) in msg and "FIFO" in msg and "not a regular file" in msg, msg
    assert TOKEN not in msg


@posix_only
def test_a_socket_or_a_device_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))
        with pytest.raises(
            TokensFileError, match=r"tokens\.sock: cannot read it: it is a socket, not a regular"
        ):
            TokenTable.load(path)
    if Path("/dev/null").exists():
        with pytest.raises(TokensFileError, match="it is a character device, not a regular file"):
            TokenTable.load("/dev/null")


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TokensFileError, match="cannot read it: it is a directory, not a regular file"):
        TokenTable.load(tmp_path)


@posix_only
def test_a_symlink_to_a_regular_file_is_read(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text(json.dumps({TOKEN: ["alice"]}), encoding="utf-8")
    link = tmp_path / "tokens.json"
    link.symlink_to(real)
    table = TokenTable.load(link)
    grant = table.lookup(TOKEN)
    assert grant is not None and grant.allows("alice") and not grant.allows("bob")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "to-pipe.json").symlink_to(fifo)
    assert "FIFO" in _refused_with_a_writer(tmp_path / "to-pipe.json", fifo)
