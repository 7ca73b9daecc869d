"""The agents' way to the controller's arrival endpoint, as a Service would be: a TCP proxy on
loopback to the leading replica's endpoint (`gangjob-arrivals` selects the leader's pod), that
the campaign can cut (every connection dropped, new ones refused) and restore."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from localcluster.procs import free_port


class ArrivalProxy:
    """Forwards each connection to `target()` (a loopback port; None: refused)."""

    def __init__(self, target: Callable[[], int | None]) -> None:
        self.target = target
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def up(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def cut(self) -> None:
        """The endpoint out of reach: the listener closed, every open stream broken."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._conns):
            w.close()
        self._conns.clear()

    async def restore(self) -> None:
        if self._server is None:
            await self.start()

    async def close(self) -> None:
        await self.cut()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = self.target()
        if port is None or self._server is None:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()  # the replica is down: as a Service without a ready endpoint
            return
        self._conns |= {writer, up_writer}
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._conns.difference_update((writer, up_writer))
            for w in (writer, up_writer):
                w.close()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    with contextlib.suppress(OSError):
        dst.close()
