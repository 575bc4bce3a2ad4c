"""An asyncio TCP proxy on 127.0.0.1 for network-fault tests.

    proxy = TcpProxy("127.0.0.1", 5432)
    await proxy.start()               # proxy.port is where clients connect
    proxy.stall()                     # stop forwarding both ways; sockets stay open (a partition)
    proxy.stall("to_client")          # only the server's replies are held back (lost replies)
    proxy.stall_replies_after(b"\x03COMMIT")  # replies held back from the request holding these bytes on
    proxy.resume()                    # forward again (held bytes are delivered, if still connected)
    await proxy.drop()                # close every connection at once (RST), as a dead link would
    await proxy.close()

Each accepted connection gets its own upstream connection and one pump per direction. A stalled
pump holds the chunk it has read and stops reading, so the kernel buffers fill as on a real
partition. A side that closes while its pump is stalled is noticed after ``resume()`` (as a peer
behind a partition would notice it), except that ``drop()`` closes everything at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass, field

__all__ = ["TcpProxy"]

DIRECTIONS = ("to_server", "to_client")


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def abort(self) -> None:
        for writer in (self.client, self.server):
            if writer is None:
                continue
            transport = writer.transport
            with contextlib.suppress(Exception):
                sock = transport.get_extra_info("socket")
                if sock is not None:  # RST, not FIN: the peer sees the link die at once
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1") -> None:
        self.target_host, self.target_port, self.listen_host = target_host, target_port, listen_host
        self._flowing = {direction: asyncio.Event() for direction in DIRECTIONS}
        for event in self._flowing.values():
            event.set()
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._reply_trigger: bytes | None = None
        self.port = 0
        self.accepted = 0
        self.bytes = dict.fromkeys(DIRECTIONS, 0)

    async def __aenter__(self) -> TcpProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.listen_host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    @property
    def connections(self) -> int:
        return len(self._links)

    def stall(self, direction: str = "both") -> None:
        """Stop forwarding ``"to_server"``, ``"to_client"`` or ``"both"`` ways; keep the sockets open."""
        for name in DIRECTIONS if direction == "both" else (direction,):
            self._flowing[name].clear()

    def stall_replies_after(self, request: bytes) -> None:
        """Once a chunk sent to the server holds ``request``, stall ``"to_client"`` before that
        chunk is forwarded: the server runs it, its reply is held back (a lost reply). One-shot."""
        self._reply_trigger = request

    def resume(self) -> None:
        self._reply_trigger = None
        for event in self._flowing.values():
            event.set()

    async def drop(self) -> None:
        """Close every open connection, both sides, at once."""
        links, self._links = list(self._links), set()
        for link in links:
            link.abort()
        for link in links:
            for task in link.tasks:
                task.cancel()
            await asyncio.gather(*link.tasks, return_exceptions=True)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.resume()
        await self.drop()
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        link = _Link(writer)
        self._links.add(link)
        try:
            server_reader, link.server = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            self._links.discard(link)
            link.abort()
            return
        link.tasks = [
            asyncio.create_task(self._pump(reader, link.server, "to_server", link)),
            asyncio.create_task(self._pump(server_reader, writer, "to_client", link)),
        ]
        await asyncio.gather(*link.tasks, return_exceptions=True)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str, link: _Link
    ) -> None:
        flowing = self._flowing[direction]
        try:
            while True:
                await flowing.wait()
                chunk = await reader.read(65536)
                if not chunk:
                    break
                await flowing.wait()  # stalled after the read: hold the chunk back
                if direction == "to_server" and self._reply_trigger is not None and self._reply_trigger in chunk:
                    self._reply_trigger = None
                    self._flowing["to_client"].clear()
                writer.write(chunk)
                await writer.drain()
                self.bytes[direction] += len(chunk)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            # One side is gone: close both, and stop the other direction's pump.
            self._links.discard(link)
            link.abort()
            for task in link.tasks:
                if task is not asyncio.current_task():
                    task.cancel()
