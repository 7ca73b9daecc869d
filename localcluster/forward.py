"""A TCP forwarder: the `kubernetes` Service address on the pod bridge -> the loopback apiserver.

There is no kube-proxy here. Pods reach the apiserver the in-cluster way (the kubelet's
KUBERNETES_SERVICE_HOST, the service-account token) because the node profile puts the Service's
cluster IP on the pod bridge, routes the service range to it, and runs this forwarder there.
The apiserver itself keeps listening on 127.0.0.1 only.

Usage: python -m localcluster.forward --listen 10.202.0.1:443 --connect 127.0.0.1:21022
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def serve(listen: tuple[str, int], connect: tuple[str, int]) -> None:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(*connect)
        except OSError:
            w.close()
            return
        await asyncio.gather(_pipe(r, uw), _pipe(ur, w))

    server = await asyncio.start_server(handle, *listen, reuse_address=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def _hostport(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host, int(port)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m localcluster.forward")
    p.add_argument("--listen", type=_hostport, required=True)
    p.add_argument("--connect", type=_hostport, required=True)
    args = p.parse_args()
    asyncio.run(serve(args.listen, args.connect))


if __name__ == "__main__":
    main()
