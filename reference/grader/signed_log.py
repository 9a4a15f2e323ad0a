"""The grading log: one signed JSON line per event, written by the test process as it runs.

The grader (parent) and the pytest child share a fresh random key per run. The parent hands it
over through a pipe (its read end's number in ``PAGEDLAB_KEY_FD``); the plugin reads it in
``pytest_configure`` — before any student code is imported — closes the pipe and drops the
variable, and keeps the key only inside an HMAC object. Each event is appended with an
HMAC-SHA256 of its body and flushed at once, so:

* a test process that dies mid-run (``os._exit``, a segfault, a kill, a timeout) leaves every
  event before its death on disk, and the parent knows which test was running;
* student code that appends or rewrites lines cannot make them count without the key: the
  parent drops lines whose signature does not match.

NOTE: this stops forging the *report*. Code running inside the test process can still patch
pytest itself; no in-process grader can rule that out (see the README's threat model).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

KEY_FD_ENV = "PAGEDLAB_KEY_FD"


def new_key() -> bytes:
    """Returns a fresh random 32-byte key."""
    return secrets.token_bytes(32)


def key_pipe(key: bytes) -> int:
    """Writes ``key`` into a new pipe and returns its read end (pass it with ``pass_fds``)."""
    read_fd, write_fd = os.pipe()
    os.write(write_fd, key)
    os.close(write_fd)
    return read_fd


def take_key_from_env() -> bytes | None:
    """Reads the key from the fd named by ``PAGEDLAB_KEY_FD``, then closes it and unsets the variable.

    Returns:
        The key, or None when no key was handed over (a plain ``pytest`` run).
    """
    raw = os.environ.pop(KEY_FD_ENV, None)
    if not raw:
        return None
    fd = int(raw)
    try:
        chunks = []
        while chunk := os.read(fd, 64):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks) or None


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


class LogWriter:
    """Appends signed events to the log file (one ``os.write`` per line, never buffered)."""

    def __init__(self, path: str | Path, key: bytes | None) -> None:
        """Opens the log for appending.

        Args:
            path: the log file (created with mode 0600).
            key: the run's key; None writes unsigned lines (which the grader ignores).
        """
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        # The key lives only inside the HMAC object; each line signs with a copy of it.
        self._mac = hmac.new(key, digestmod=hashlib.sha256) if key else None

    def write(self, body: dict) -> None:
        """Appends one event."""
        data = _canonical(body)
        sig = None
        if self._mac is not None:
            mac = self._mac.copy()
            mac.update(data)
            sig = mac.hexdigest()
        line = json.dumps({"sig": sig, "body": body}, separators=(",", ":")) + "\n"
        os.write(self._fd, line.encode())

    def close(self) -> None:
        """Closes the file."""
        os.close(self._fd)


def read_log(path: str | Path, key: bytes) -> tuple[list[dict], int]:
    """Returns the events whose signature checks out, and the number of lines rejected.

    Args:
        path: the log file.
        key: the run's key.

    Returns:
        (event bodies in file order, count of unsigned, forged or unreadable lines).
    """
    tail = LogTail(path, key)
    events = tail.poll(final=True)
    return events, tail.rejected


def verify_line(line: bytes, key: bytes) -> dict | None:
    """Returns the event body of one log line, or None if it is unreadable or wrongly signed."""
    try:
        item = json.loads(line)
        body, sig = item["body"], item["sig"]
        want = hmac.new(key, _canonical(body), hashlib.sha256).hexdigest()
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(sig, str) or not isinstance(body, dict) or not hmac.compare_digest(sig, want):
        return None
    return body


class LogTail:
    """Reads a growing log incrementally (the grader watches the run through it)."""

    def __init__(self, path: str | Path, key: bytes) -> None:
        self._path, self._key = Path(path), key
        self._offset, self._partial = 0, b""
        self.rejected = 0

    def poll(self, final: bool = False) -> list[dict]:
        """Returns the verified events appended since the last call.

        Args:
            final: the writer is gone; a last line without a newline is read too.
        """
        try:
            with open(self._path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = b"" if final else lines.pop()
        events = []
        for line in lines:
            if not line.strip():
                continue
            body = verify_line(line, self._key)
            if body is None:
                self.rejected += 1
            else:
                events.append(body)
        return events
