"""The receiver-side framing check of the test clients (tests/jgroups_clients.py,
tests/nclient.py), which every hostile and fast-path test reads the router through: bytes
that are not whole, valid frames fail the test instead of being skipped (issue 24: a frame
cut into another one corrupted a member's stream while every other check passed)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
import trio.testing

from gossiprouter.protocol import jgroups2 as j2
from gossiprouter.protocol import jgroups5 as j5
from gossiprouter.protocol import native as wire
from gossiprouter.protocol.errors import ProtocolError
from tests.jgroups_clients import J2Client, J5Client, uuid
from tests.nclient import NativeClient


def _stream() -> Any:
    return trio.testing.memory_stream_pair()[0]


async def test_a_5x_frame_that_does_not_parse_fails() -> None:
    c = J5Client(_stream())
    frame = j5.message("g", None, uuid(1, 5), b"payload")
    # A frame that lands inside another shifts the lengths: a body that does not parse.
    c.decoder.feed(struct.pack(">I", 3) + frame[4:7] + frame)
    with pytest.raises(AssertionError, match="framing violation"):
        await c.recv()


async def test_a_2_12_object_of_a_type_the_router_never_sends_fails() -> None:
    c = J2Client(_stream())
    c.decoder.feed(j2.ping())  # client -> router only
    with pytest.raises(AssertionError, match="framing violation"):
        await c.recv()


async def test_a_native_frame_that_does_not_parse_fails() -> None:
    c = NativeClient(_stream(), _stream())
    c.decoder.feed(struct.pack(">I", 3) + b"\x95\x06\xa1" + wire.encode(wire.Pong(1)))
    with pytest.raises(ProtocolError):
        await c.recv()
