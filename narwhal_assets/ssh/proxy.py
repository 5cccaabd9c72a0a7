"""A ProxyCommand, run as OpenSSH runs it: `$SHELL -c "exec COMMAND"` (the tokens already expanded), its
standard input and output the SSH connection.

The command's end of the connection is one side of a socket pair, so the transport reads and writes an
ordinary socket (timeouts, shutdown, select). The command runs in a session of its own (no terminal to
prompt on, and one process group to kill): closing the proxy kills that group, so a proxy never outlives
its connection, and a deadline on the handshake is a deadline on the proxy. What it prints on standard
error is kept (the last `STDERR_LIMIT` bytes) for the failure message and the host's log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading

from narwhal_assets.core.display import printable

STDERR_LIMIT = 16 << 10
GRACE_S = 1.0


class ProxyCommandFailed(OSError):
    """The ProxyCommand could not be started."""


class ProxyCommand:
    """One running ProxyCommand; `sock` is the connection's end."""

    def __init__(self, command: str) -> None:
        shell = os.environ.get("SHELL") or "/bin/sh"
        ours, theirs = socket.socketpair()
        try:
            # A socket is a file with a fileno, all Popen needs (typeshed asks for an int or IO).
            self.process = subprocess.Popen(  # type: ignore[call-overload]
                [shell, "-c", f"exec {command}"], stdin=theirs, stdout=theirs, stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise ProxyCommandFailed(exc.errno, f"cannot start the ProxyCommand: {exc.strerror}") from None
        finally:
            theirs.close()
        self.sock = ours
        self._stderr = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_stderr, name="ssh-proxy-stderr", daemon=True)
        self._reader.start()

    def stderr(self) -> str:
        """What the command printed on standard error (its end, when it printed more than the limit)."""
        with self._lock:
            return bytes(self._stderr).decode("utf-8", "replace")

    def describe(self) -> str:
        """`ProxyCommand exited 255: <its last stderr line>`, or `ProxyCommand running` (for messages)."""
        rc = self.process.poll()
        if rc is not None:  # it exited: what it printed is read to its end (unless a child still holds the pipe)
            self._reader.join(GRACE_S)
        state = "ProxyCommand running" if rc is None else f"ProxyCommand exited {rc}"
        lines = [line for line in self.stderr().splitlines() if line.strip()]
        return state + (f": {printable(lines[-1], 200)}" if lines else "")

    def close(self) -> None:
        """Close the connection's end and end the command's whole process group."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(GRACE_S)
        self._signal(signal.SIGKILL)  # whatever of the group is left (its own children included)
        self.process.wait()
        self._reader.join(GRACE_S)
        if self.process.stderr is not None:
            self.process.stderr.close()

    def _signal(self, number: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, number)

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        with contextlib.suppress(OSError, ValueError):
            while chunk := self.process.stderr.read1(4096):
                with self._lock:
                    self._stderr += chunk
                    del self._stderr[:-STDERR_LIMIT]
