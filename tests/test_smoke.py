from gossiprouter.protocol import native as wire
from gossiprouter.server.listener import Server
from tests.nclient import NativeClient


async def test_smoke(router: Server) -> None:
    assert router.address
    a = await NativeClient.open(*router.address)
    b = await NativeClient.open(*router.address)
    assert isinstance(await a.connect("g", b"A", "A", (("10.0.0.1", 7800),)), wire.Ok)
    assert isinstance(await b.connect("g", b"B", "B"), wire.Ok)
    await a.send(wire.Route("g", b"B", b"A", b"hello"))
    f = await b.recv()
    assert f == wire.Route("g", b"B", b"A", b"hello")
    m = await a.request(wire.GetMembers(a.req(), "g"))
    assert isinstance(m, wire.Ok) and m.members is not None
    assert [x.name for x in m.members] == ["A", "B"]
