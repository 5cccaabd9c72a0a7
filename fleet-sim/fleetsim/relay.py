"""A TCP relay that delays every byte, as a slow link in front of one simulated host (this kernel has no netem).

fleet.py runs it inside the host's network namespace, on the host's management address and port, with the
host's sshd listening on loopback only, so the workstation reaches the same address, port and host key
as without it, `cut_link` still cuts it, and killing the host kills the relay with it. Per connection:

- the upstream connection to sshd is opened 1.5 round trips after the client's (SYN, SYN-ACK, ACK: what a
  real link makes a new connection wait before the server sees it; here the client's connect returns at
  once, and what it sends meanwhile waits its turn);
- every chunk read from one side is written to the other `latency` seconds after it was read, in order, so
  each direction costs `latency` and a round trip 2 x `latency`; bandwidth is not limited;
- an end of stream travels the same way (half-close), and a reset or a closed sshd closes both sides.

The one-way latency in seconds is read from LATENCY_FILE at every new connection, so `SimFleet.set_latency`
changes it for the connections that follow. Standard library only: run as `python3 -I -S relay.py ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from pathlib import Path

CHUNK = 65536
QUEUED_CHUNKS = 256  # per direction (16 MiB): beyond it the relay stops reading, and TCP pushes back
HANDSHAKE_ROUND_TRIPS = 1.5


def read_latency(path: Path) -> float:
    try:
        value = float(path.read_text(encoding="ascii"))
    except (OSError, ValueError):
        return 0.0
    return max(0.0, value)


async def _carry(reader: asyncio.StreamReader, writer: asyncio.Future[asyncio.StreamWriter], latency: float) -> None:
    """Copy `reader` to the writer once it exists, each chunk `latency` seconds after it was read; raises
    ConnectionResetError when either side is reset."""
    queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue(QUEUED_CHUNKS)

    async def read() -> None:
        try:
            while chunk := await reader.read(CHUNK):
                await queue.put((time.monotonic() + latency, chunk))
        except OSError:
            await queue.put((0.0, None))  # a reset ends the connection at once
            return
        await queue.put((time.monotonic() + latency, b""))

    reading = asyncio.ensure_future(read())
    try:
        out = await writer
        while True:
            due, chunk = await queue.get()
            if chunk is None:
                raise ConnectionResetError("reset by the other side")
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            if not chunk:
                if out.can_write_eof():
                    out.write_eof()
                return
            out.write(chunk)
            await out.drain()
    finally:
        await _cancel(reading)


async def _cancel(*tasks: asyncio.Future[None]) -> None:
    """Cancel and wait for `tasks`, so none is left pending or with an unread exception."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await task


async def _relay(client_reader: asyncio.StreamReader, client: asyncio.StreamWriter, args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    latency = read_latency(args.latency_file)
    upstream: asyncio.Future[asyncio.StreamWriter] = loop.create_future()
    downstream: asyncio.Future[asyncio.StreamWriter] = loop.create_future()
    downstream.set_result(client)
    server: asyncio.StreamWriter | None = None
    carriers = [asyncio.ensure_future(_carry(client_reader, upstream, latency))]
    try:
        await asyncio.sleep(HANDSHAKE_ROUND_TRIPS * 2 * latency)
        server_reader, server = await asyncio.open_connection(args.upstream_host, args.upstream_port)
        upstream.set_result(server)
        carriers.append(asyncio.ensure_future(_carry(server_reader, downstream, latency)))
        await asyncio.wait(carriers, return_when=asyncio.FIRST_EXCEPTION)
    except OSError:  # sshd is not listening (stopped or killed): the client sees the connection close
        pass
    finally:
        await _cancel(*carriers)
        for writer in (client, server):
            if writer is not None:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()


async def serve(args: argparse.Namespace) -> None:
    server = await asyncio.start_server(
        lambda r, w: _relay(r, w, args), args.listen_host, args.listen_port, reuse_address=True
    )
    stop = asyncio.get_running_loop().create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    async with server:
        await stop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("listen_host")
    parser.add_argument("listen_port", type=int)
    parser.add_argument("upstream_host")
    parser.add_argument("upstream_port", type=int)
    parser.add_argument("latency_file", type=Path)
    asyncio.run(serve(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
