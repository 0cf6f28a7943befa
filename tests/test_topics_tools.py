"""Topic multicast through the blocking facade and the ``publish`` / ``listen --subscribe``
commands (real subprocesses against an in-process router)."""

from __future__ import annotations

import trio

from gossiprouter import BlockingRouterStub
from gossiprouter.server.listener import Server
from gossiprouter.stub import Publication, RouterStub
from tests.test_blocking_and_tools import Listener, cli, hostport
from tests.test_stub import FAST, drain


async def test_publish_and_listen_subscribe_commands(router: Server) -> None:
    hp = hostport(router)
    assert router.address is not None
    listener = await Listener.start(hp, "demo", "--subscribe", "v17/pos/eu/*",
                                    "--subscribe", "v17/pos/+/de")
    try:
        first = await listener.next()
        assert first["type"] == "members"
        with trio.fail_after(10):
            while len(router.hub.table.patterns().get("demo", [])) < 2:
                await trio.sleep(0.02)
        r = await cli("publish", hp, "demo", "v17/pos/eu/de", "hello", "--global")
        assert r.returncode == 0, r.stderr
        assert b"(global)" in r.stdout
        obj = await listener.next()
        # the join of the publishing member may come first
        while obj["type"] != "publication":
            obj = await listener.next()
        assert obj == {"type": "publication", "group": "demo", "sender": obj["sender"],
                       "topic": ["v17", "pos", ["eu", "de"]], "scope": "global",
                       "text": "hello", "payload_hex": "68656c6c6f"}
        bad = await cli("publish", hp, "demo", "v17/pos/eu/+", "x")
        assert bad.returncode != 0
        assert b"concrete" in bad.stderr and b"Traceback" not in bad.stderr
        bad = await cli("listen", hp, "demo", "--subscribe", "v17/pos/*/x")
        assert bad.returncode != 0 and b"last partition element" in bad.stderr
    finally:
        listener.kill()


async def test_blocking_facade_subscribe_and_publish(router: Server) -> None:
    assert router.address is not None
    addr = router.address
    got: list[object] = []

    def work() -> None:
        with BlockingRouterStub([addr], **FAST) as stub:
            ch = stub.connect("g", b"B")
            ch.subscribe("p", "b", ["*"])
            ch.publish(("p", "b", ["x"]), b"to myself", echo=True)
            got.append(ch.receive(timeout=5))
            ch.unsubscribe("p", "b", ["*"])

    async with RouterStub([addr], **FAST) as s:
        other = await s.connect("g", b"O")
        await other.subscribe("p", "b", ["+"])
        await trio.to_thread.run_sync(work)
        [m] = await drain(other, 0.1)
    assert isinstance(m, Publication) and m.payload == b"to myself"
    [mine] = got
    assert isinstance(mine, Publication) and mine.topic == ("p", "b", ("x",))
