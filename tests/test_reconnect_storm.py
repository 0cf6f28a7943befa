"""Reconnect storm (issue 5, acceptance 3): 500 stubs survive a router restart.

500 RouterStubs, each with one channel, are registered with a router process;
the router is stopped and started again on the same port. Every stub must
reconnect and re-register by itself within 15 s, with no error reaching the
application other than the expected reconnects. The time it took is printed
(run with -s) for the notes.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
import trio

from gossiprouter import RouterStub
from gossiprouter.stub import ConnectionState, StubEvent
from tests.nclient import NativeClient
from tests.procs import RouterProcess

# Several seconds and 500 sockets: left out of a quick `pytest -m "not slow"` run.
pytestmark = pytest.mark.slow

N = 500


async def _count_members(port: int) -> int:
    c = await NativeClient.open("127.0.0.1", port)
    try:
        return len(await c.member_list("storm"))
    finally:
        await c.aclose()


async def test_500_stubs_reregister_after_restart() -> None:
    states: Counter[str] = Counter()
    errors: list[str] = []
    closing = False

    def on_state(ev: StubEvent) -> None:
        states[ev.state.value] += 1
        if ev.state is ConnectionState.CLOSED and not closing:
            errors.append(f"closed: {ev.error}")

    router = RouterProcess(None, "--log-level", "warning").start()
    port = router.port
    try:
        async with contextlib.AsyncExitStack() as stack:
            stubs = []
            for _ in range(N):
                stubs.append(await stack.enter_async_context(RouterStub(
                    [("127.0.0.1", port)], on_state=on_state, reconnect_initial=0.5,
                    reconnect_max=4.0, heartbeat_interval=2.0, heartbeat_timeout=6.0,
                    send_timeout=20.0)))
            with trio.fail_after(30):
                for i, stub in enumerate(stubs):
                    await stub.connect("storm", b"M%04d" % i, name=f"m{i}")
            assert await _count_members(port) == N

            assert router.stop() == 0
            down = trio.current_time()
            await trio.sleep(1.0)
            router = RouterProcess(port, "--log-level", "warning").start()
            back = trio.current_time()
            with trio.fail_after(15):
                while await _count_members(port) < N:
                    await trio.sleep(0.1)
            took = trio.current_time() - back
            print(f"\n{N} stubs re-registered {took:.2f} s after the restart "
                  f"({trio.current_time() - down:.2f} s after the router stopped)")
            assert await _count_members(port) == N
            # Traffic resumes without the application doing anything.
            chan = stubs[0].channels()[0]
            await chan.send(b"after the storm", dest=b"M0001")
            with trio.fail_after(5):
                msg = await stubs[1].channels()[0].receive()
            assert msg.payload == b"after the storm"
            closing = True
    finally:
        router.stop()
    assert errors == []
    assert states["reconnecting"] >= N  # every stub noticed and reconnected
    assert states["connected"] >= 2 * N
