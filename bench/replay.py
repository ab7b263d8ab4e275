"""A replaying HTTP server: the client-side floor for bench/api.py.

Answers each distinct GET (target plus the microversion and Accept headers)
with the exact bytes the upstream api sent the first time, from memory, from
the parser callback: no database, no routing, no JSON encoding. Whatever
latency openstacksdk still shows against it is the client's own cost on
this machine, which no server can remove.

    .venv/bin/python bench/replay.py --upstream http://127.0.0.1:6385 --ports-file /tmp/replay.json
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import signal
import urllib.parse
from pathlib import Path

import httptools

KEY_HEADERS = (b"x-openstack-ironic-api-version", b"openstack-api-version", b"accept")
DROP = {"connection", "transfer-encoding", "content-length", "date", "keep-alive"}


class Replay:
    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.cache: dict[tuple[bytes, ...], bytes] = {}
        self.misses = 0
        self.own = ""  # our host:port, put in place of the upstream's in bodies (links, next)

    def fetch(self, method: str, target: str, headers: dict[str, str]) -> bytes:
        """The upstream's whole response, re-framed with Content-Length."""
        self.misses += 1
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.request(method, target, headers=headers)
            response = conn.getresponse()
            body = response.read().replace(f"{self.host}:{self.port}".encode(), self.own.encode())
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in DROP]
        finally:
            conn.close()
        head = f"HTTP/1.1 {response.status} {response.reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in kept)
        return (head + f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1") + body


class Connection(asyncio.Protocol):
    def __init__(self, replay: Replay) -> None:
        self.replay = replay
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[bytes, bytes] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_message_begin(self) -> None:
        self.url, self.headers = b"", {}

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_message_complete(self) -> None:
        method = self.parser.get_method()
        key = (method, self.url, *(self.headers.get(h, b"") for h in KEY_HEADERS))
        reply = self.replay.cache.get(key)
        if reply is not None and self.transport is not None:
            self.transport.write(reply)
            return
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in self.headers.items()
            if k not in (b"host", b"connection", b"content-length")
        }
        asyncio.get_running_loop().create_task(self._miss(key, method.decode(), self.url.decode("latin-1"), headers))

    async def _miss(self, key: tuple[bytes, ...], method: str, target: str, headers: dict[str, str]) -> None:
        reply = await asyncio.to_thread(self.replay.fetch, method, target, headers)
        if method == "GET":
            self.replay.cache[key] = reply
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(reply)


async def serve(upstream: str, ports_file: Path) -> None:
    replay = Replay(upstream)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(replay), "127.0.0.1", 0)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    replay.own = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    ports_file.write_text(json.dumps({"url": f"http://{replay.own}"}))
    await stop.wait()
    server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--ports-file", required=True, type=Path)
    args = parser.parse_args()
    asyncio.run(serve(args.upstream, args.ports_file))


if __name__ == "__main__":
    main()
