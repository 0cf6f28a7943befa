"""``admin-poll``: GETs of the router's HTTP endpoint (``/groups``, ``/metrics``), timed."""

from __future__ import annotations

import trio

from gossiprouter.loadtest.attacks.base import Attack

__all__ = ["AdminPoll"]


class AdminPoll(Attack):
    async def run(self) -> None:
        if self.metrics is None:
            return
        host, _, port = self.metrics.rpartition(":")
        while True:
            for path in self.spec["paths"]:
                t = trio.current_time()
                status = await self.get(host, int(port), path)
                took = trio.current_time() - t
                if status == 200:
                    self.c.answers += 1
                    self.c.slowest_s = max(self.c.slowest_s, took)
                else:
                    self.c.failures += 1
            await trio.sleep(self.spec["interval"])

    async def get(self, host: str, port: int, path: str) -> int:
        try:
            s = await trio.open_tcp_stream(host, port)
        except OSError:
            return 0
        self.c.opened += 1
        buf = bytearray()
        try:
            request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
            await s.send_all(request.encode())
            while data := await s.receive_some(1 << 20):
                buf += data
        except (trio.BrokenResourceError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(s)
        self.c.bytes_in += len(buf)
        try:
            return int(buf.split(b" ", 2)[1])
        except (IndexError, ValueError):
            return 0
