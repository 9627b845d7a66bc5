"""A TCP forwarder the two-host test runs in the root namespace: ``forwarder.py LISTEN=TARGET...``.

Each argument is ``host:port=host:port``: connections accepted on the first address are
piped to the second. PostgreSQL and the private Redis listen on 127.0.0.1 only, which a
network namespace can't reach; this process, bound to the root side of each namespace's veth
pair, carries the "hosts'" traffic to them without touching the machine's services. Prints
``READY`` once every address listens; runs until killed.
"""

from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


def _handler(target_host: str, target_port: int):  # noqa: ANN202 - a closure for start_server
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return handle


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def main(routes: list[str]) -> None:
    servers = []
    for route in routes:
        listen, _, target = route.partition("=")
        host, port = _address(listen)
        servers.append(await asyncio.start_server(_handler(*_address(target)), host, port))
    print("READY", flush=True)
    await asyncio.gather(*(server.serve_forever() for server in servers))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
