"""paho-mqtt's per-message overheads on the routed-frames path, made cheap (issue 30).

Profiled on the interleaved case (bench_federation.py, one message a tick over 3 routers,
cProfile on thread CPU time), a third or more of a router's CPU per cross-router message was
paho's, not the routing's:

* **Properties**: paho's :class:`~paho.mqtt.properties.Properties` finds a property's name
  or identifier by scanning all 27 names with a ``str.replace`` each, several times per
  property, and builds its tables anew for every packet: 33 to 60 µs to read a PUBLISH with no
  property at all, 110 to 125 µs with a routed message's three user properties, 80 to 120 µs to
  build and pack them (on the loaded 2-core machine). :class:`FastProperties` is the same
  class with those look-ups in tables built once (same attributes, errors and bytes; 2, 10
  and 10 µs); :func:`install` makes paho decode every received PUBLISH's properties with it.
* **Reads**: paho reads a packet with a ``recv`` of 1 byte for its type, 1 per byte of its
  length and one for the rest, and ``loop_read`` handles one packet (at QoS 0) per call: 3 to
  5 system calls and one wake-up of the reader task per broker message.
  :class:`BufferedClient` reads what the socket has (up to :data:`RECV_CHUNK`) in one
  ``recv`` and serves paho's small reads from it; :meth:`BufferedClient.buffered` tells the
  reader to handle the next packet before waiting on the socket again.
  A whole QoS 0 PUBLISH already read is taken from that buffer in one go
  (:meth:`BufferedClient._packet_read`; paho reads its type, each byte of its length and the
  rest in as many reads, each a call and a copy), and the ``recv`` itself reads into a buffer
  kept for the connection (a new 256 KiB ``bytes`` for each was an ``mmap``, an ``mremap``
  and a ``munmap`` per broker message: three system calls of the six a wake-up made).
* **Writes**: paho writes each packet at once, one ``send`` per PUBLISH, and a ``send`` on
  loopback carries the broker's side of TCP and its wake-up too: the router's largest cost
  per tick with routed messages to two routers. :meth:`BufferedClient.corked` holds paho's
  inline writes while a tick's messages are published, then writes them all in one ``send``
  (:meth:`BufferedClient._packet_write`: paho's own bookkeeping per packet, fed from that one
  ``send``).
  :meth:`BufferedClient.uncork` writes a queue of only those routed messages itself, in one
  ``send`` past paho's ``loop_write`` and its bookkeeping per packet (a tenth of the sending
  router's time in Python at one message a tick).
* **Publishes**: paho's ``publish`` checks, logs, builds a message info and a Properties
  object, packs them and queues the packet, for each routed message: a third of the sending
  router's time in Python. :meth:`BufferedClient.publish_qos0` queues the same bytes, built
  directly, for a QoS 0 PUBLISH with user properties only (the routed messages').
  :attr:`BufferedClient.fast_publish` is the same on the way in: a received QoS 0 PUBLISH
  whose properties are user properties only is read directly and handed to it, without
  paho's decoding, logging, MQTTMessage and subscription matching (paho's path when it
  declines, or for anything else).
"""

from __future__ import annotations

import socket
import struct
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from paho.mqtt.client import Client, MQTTMessageInfo, time_func
from paho.mqtt.enums import LogLevel, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.exception import MalformedPacket, MQTTException
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties, VariableByteIntegers

from gossiprouter.federation.link import Link

# One recv's bound: what the socket has, up to this, is read at once.
RECV_CHUNK = 256 * 1024
# One gathered send's bound (bytes): a longer queue goes out in several.
SEND_CHUNK = 256 * 1024
_PUBLISH = 0x30
# What paho marks published when a QoS 0 packet is written (the queued packets of
# publish_qos0 share it: nobody waits on them).
_NO_WAIT = MQTTMessageInfo(0)

_REF = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
_NAMES: dict[str, int] = _REF.names
_TABLE: dict[int, tuple[int, list[int]]] = _REF.properties
_TYPES: list[str] = _REF.types
_SHARED = {k: v for k, v in vars(_REF).items() if k != "packetType"}
_IDENT = {name.replace(" ", ""): ident for name, ident in _NAMES.items()}
_NAME = {ident: name for name, ident in _NAMES.items()}
_ORDER = list(_IDENT)  # paho's order of the properties in a packet
_MULTIPLE = (11, 38)  # Subscription Identifier, User Property
_STRING = _TYPES.index("UTF-8 Encoded String")
_PAIR = _TYPES.index("UTF-8 String Pair")
_USER = 38
_U16 = struct.Struct("!H")
_PRIVATE = frozenset({"packetType", "types", "names", "properties"})
# Names whose values paho checks for a range: those go through paho's own __setattr__.
_RANGED = frozenset({"ReceiveMaximum", "TopicAlias", "TopicAliasMaximum", "MaximumPacketSize",
                     "SubscriptionIdentifier", "RequestResponseInformation",
                     "RequestProblemInformation", "PayloadFormatIndicator"})


class FastProperties(Properties):
    """paho's Properties with its look-ups in tables built once (see the module docstring):
    the same attributes, errors and packed bytes."""

    def __init__(self, packetType: int) -> None:
        d = self.__dict__
        d.update(_SHARED)  # (whatever paho's __init__ sets, built once)
        d["packetType"] = packetType

    def getIdentFromName(self, compressedName: str) -> int:
        return _IDENT.get(compressedName, -1)

    def getNameFromIdent(self, identifier: int) -> str | None:
        return _NAME.get(identifier)

    def allowsMultiple(self, compressedName: str) -> bool:
        return _IDENT.get(compressedName) in _MULTIPLE

    def __setattr__(self, name: str, value: Any) -> None:
        name = name.replace(" ", "")
        ident = _IDENT.get(name)
        if (name in _PRIVATE or ident is None or self.packetType not in _TABLE[ident][1]
                or (name in _RANGED and not isinstance(value, list))):
            super().__setattr__(name, value)  # type: ignore[no-untyped-call]  # paho's checks
            return
        if ident in _MULTIPLE:
            if not isinstance(value, list):
                value = [value]
            old = self.__dict__.get(name)
            if old is not None:
                value = old + value
        self.__dict__[name] = value

    def clear(self) -> None:
        d = self.__dict__
        for name in [n for n in d if n in _IDENT]:
            del d[name]

    def pack(self) -> bytes:
        buffer = b""
        d = self.__dict__
        for name in _ORDER:
            value: Any = d.get(name)
            if value is None and name not in d:
                continue
            ident = _IDENT[name]
            if ident == _USER:  # the routed messages' properties: written directly
                buffer += b"".join(b"\x26" + _utf(k) + _utf(v) for k, v in value)
                continue
            kind = _TABLE[ident][0]
            for v in value if ident in _MULTIPLE else (value,):
                buffer += self.writeProperty(ident, kind, v)  # type: ignore[no-untyped-call]
        return bytes(VariableByteIntegers.encode(len(buffer))) + buffer  # type: ignore[no-untyped-call]

    def readProperty(self, buffer: bytes, type: int,
                     propslen: int) -> tuple[Any, int]:
        if type == _STRING:
            return _read_utf(buffer, propslen)
        if type == _PAIR:
            key, n = _read_utf(buffer, propslen)
            value, m = _read_utf(buffer[n:], propslen - n)
            return (key, value), n + m
        read: tuple[Any, int] = super().readProperty(  # type: ignore[no-untyped-call]
            buffer, type, propslen)
        return read

    def unpack(self, buffer: bytes | bytearray) -> tuple[FastProperties, int]:
        """paho's unpack, over the properties only (paho's slices the rest of the packet,
        the payload included, after each property)."""
        self.clear()
        propslen, n = VariableByteIntegers.decode(buffer)  # type: ignore[no-untyped-call]
        if not propslen:
            return self, n
        # (paho reads past the end of a short buffer as an error too: an IndexError or a
        # struct.error, which decode_publish turns into MalformedPacket.)
        props = bytes(buffer[n:n + propslen])
        if len(props) < propslen:
            raise IndexError("properties cut short")
        pos = 0
        d = self.__dict__
        users_here = self.packetType in _TABLE[_USER][1]
        while pos < propslen:
            if props[pos] == _USER and users_here:  # a user property (one byte: 38)
                key, k = _read_utf(props[pos + 1:], propslen - pos - 1)
                value, m = _read_utf(props[pos + 1 + k:], propslen - pos - 1 - k)
                pos += 1 + k + m
                users = d.get("UserProperty")
                if users is None:
                    d["UserProperty"] = [(key, value)]
                else:
                    users.append((key, value))
                continue
            ident, k = VariableByteIntegers.decode(props[pos:])  # type: ignore[no-untyped-call]
            pos += k
            kind = self.properties[ident][0]
            value, k = self.readProperty(props[pos:], kind, propslen - pos)
            pos += k
            name = _NAME[ident]
            compressed = name.replace(" ", "")
            if ident not in _MULTIPLE and compressed in self.__dict__:
                raise MQTTException(f"Property '{compressed}' must not exist more than once")
            setattr(self, name, value)
        return self, propslen + n


def read_publish(data: bytes | bytearray
                 ) -> tuple[str, bytes, list[tuple[str, str]]] | None:
    """(topic, payload, user properties) of the variable header and payload of an MQTT 5
    QoS 0 PUBLISH, or None when it has a property other than user properties, or anything
    paho should judge (a malformed packet: paho's decoding refuses it as it always has)."""
    packet = bytes(data)
    try:
        (n,) = _U16.unpack_from(packet)
        topic = bytes(packet[2:2 + n]).decode("utf-8")
        pos = 2 + n
        if not topic or "\x00" in topic:
            return None
        plen, k = VariableByteIntegers.decode(packet[pos:pos + 4])  # type: ignore[no-untyped-call]
        pos += k
        end = pos + plen
        if end > len(packet):
            return None
        users: list[tuple[str, str]] = []
        while pos < end:
            if packet[pos] != _USER:
                return None
            key, k = _read_utf(packet[pos + 1:end], end - pos - 1)
            pos += 1 + k
            value, k = _read_utf(packet[pos:end], end - pos)
            pos += k
            users.append((key, value))
        return topic, bytes(packet[end:]), users
    except (MalformedPacket, UnicodeDecodeError, struct.error, IndexError, ValueError):
        return None


def user_properties(pairs: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> bytes:
    """User properties, packed as paho packs them (:meth:`FastProperties.pack`)."""
    return b"".join(b"\x26" + _utf(k) + _utf(v) for k, v in pairs)


def property_key(name: str) -> bytes:
    """A user property's identifier and key, as :func:`user_properties` packs them (its value
    follows)."""
    return b"\x26" + _utf(name)


def _vbi(n: int) -> bytes:
    """An MQTT Variable Byte Integer."""
    if n < 128:
        return bytes((n,))
    return bytes(VariableByteIntegers.encode(n))  # type: ignore[no-untyped-call]


def _utf(data: str | bytes) -> bytes:
    """paho's writeUTF."""
    b = data.encode() if isinstance(data, str) else data
    return _U16.pack(len(b)) + b


def _read_utf(buffer: bytes, maxlen: int) -> tuple[str, int]:
    """paho's readUTF (a strict UTF-8 decode refuses the surrogates D800-DFFF already;
    paho looks at every character in a Python loop)."""
    if maxlen < 2:
        raise MalformedPacket("Not enough data to read string length")
    (length,) = _U16.unpack_from(buffer)
    if length > maxlen - 2:
        raise MalformedPacket("Length delimited string too long")
    s = bytes(buffer[2:2 + length]).decode("utf-8")
    if "\x00" in s:
        raise MalformedPacket("[MQTT-1.5.4-2] Null found in UTF-8 data")
    if "\ufeff" in s:
        raise MalformedPacket("[MQTT-1.5.4-3] U+FEFF in UTF-8 data")
    return s, length + 2


def install() -> None:
    """Decode received PUBLISH packets' properties with :class:`FastProperties` (paho's
    ``decode_publish`` builds them; with a paho laid out otherwise, nothing changes)."""
    try:
        from paho.mqtt import _packet
    except ImportError:  # (paho 2.0: decode_publish inside the client)
        return
    if getattr(_packet, "Properties", None) is Properties:
        _packet.Properties = FastProperties  # type: ignore[attr-defined]


# The private parts of paho's Client that BufferedClient builds on (as in paho 2.2, tested). A paho
# laid out otherwise gets paho's own reads, writes, publish and PUBLISH handling: slower,
# never wrong (BufferedClient.fast is False then).
_PAHO_METHODS = ("_sock_recv", "_sock_send", "_packet_write", "_handle_publish", "loop_write")


def _paho_laid_out_as_known(client: Client) -> bool:
    """Whether ``client`` (a new paho Client) has the private parts BufferedClient uses."""
    if not all(callable(getattr(Client, name, None)) for name in _PAHO_METHODS):
        return False
    out, inp = getattr(client, "_out_packet", None), getattr(client, "_in_packet", None)
    return (isinstance(out, deque) and isinstance(inp, dict)
            and {"command", "packet"} <= inp.keys()
            and hasattr(client, "_sock") and hasattr(client, "_protocol"))


class BufferedClient(Client):
    """paho's Client whose reads come from one ``recv`` of what the socket has (see the
    module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # False with a paho whose private parts differ: every method below is paho's own.
        self.fast = _paho_laid_out_as_known(self)
        self._rbuf = b""
        self._rpos = 0
        # What recv_into reads into (plain sockets; allocated at the first read).
        self._rinto: bytearray | None = None
        self._corked = False
        # Bytes of the queued packets one gathered send wrote, not yet taken by paho's
        # per-packet bookkeeping (_packet_write).
        self._sent_ahead = 0
        self.gathered_sends = 0  # sends that wrote more than one packet (tests, profiles)
        self.direct_sends = 0  # uncork()'s sends past paho's loop_write (tests, profiles)
        self.whole_reads = 0  # PUBLISH packets _packet_read took at once (tests, profiles)
        self.uncorked_rc = MQTTErrorCode.MQTT_ERR_SUCCESS
        # (topic, payload, user properties) of a received QoS 0 PUBLISH with no other
        # property: True when handled, False for paho's own handling (on_message).
        self.fast_publish: Callable[[str, bytes, list[tuple[str, str]]], bool] | None = None
        # The relay thread's broker link (federation/link.py), while it writes the socket:
        # every byte for the broker goes through it, in order with the thread's own.
        self.link: Link | None = None
        # While the thread also reads the socket: what it handed up, not read by paho yet
        # (None: paho reads the socket itself), and how the stream ended (True: EOF).
        self.fed: bytearray | None = None
        self.fed_end: OSError | bool = False
    @contextmanager
    def corked(self) -> Iterator[None]:
        """paho writes nothing inline meanwhile (its packets queue); at the end, what was
        queued is written, in one ``send`` (its result is :attr:`uncorked_rc`)."""
        self.cork()
        try:
            yield
        finally:
            self.uncork()

    def cork(self) -> None:
        """:meth:`corked`'s start, without a context manager (a tick's flush)."""
        self._corked = True

    def uncork(self) -> MQTTErrorCode:
        """:meth:`corked`'s end: what was queued, written (:attr:`uncorked_rc`)."""
        self._corked = False
        q = self._out_packet
        if not q:
            rc = MQTTErrorCode.MQTT_ERR_SUCCESS
        elif not self._send_direct(q):
            rc = self.loop_write()
        else:
            rc = MQTTErrorCode.MQTT_ERR_SUCCESS
        self.uncorked_rc = rc
        return rc

    def _send_direct(self, q: deque[Any]) -> bool:
        """The queue written in one ``send`` of a plain socket, with paho's bookkeeping done
        here, when it holds only :meth:`publish_qos0`'s packets, none begun (nobody waits
        on them: no ``on_publish``, no message info); what the socket does not take stays
        queued, the first packet's written part marked as paho marks it. False: nothing
        done (anything else, or a send that failed), for paho's ``loop_write``, which meets
        the same failure and handles it as it always has."""
        sock = self._sock
        if (not self.fast or type(sock) is not socket.socket or self._sent_ahead
                or self.on_publish is not None):
            return False
        for p in q:
            if p["info"] is not _NO_WAIT or p["pos"]:
                return False
        try:
            n = self._raw_send(q[0]["packet"] if len(q) == 1 else
                               b"".join([p["packet"] for p in q]))
        except BlockingIOError:
            n = 0
        except OSError:
            return False
        self.direct_sends += 1
        while q and n >= q[0]["to_process"]:
            n -= q.popleft()["to_process"]
        if n:
            q[0]["pos"] = n
            q[0]["to_process"] -= n
        with self._msgtime_mutex:
            self._last_msg_out = time_func()
        if q:  # (as paho's loop_write ends)
            self._call_socket_register_write()
        else:
            self._call_socket_unregister_write()
        return True

    def publish_qos0(self, topic: bytes, users: list[tuple[str, str]],
                     payload: bytes) -> MQTTErrorCode:
        """paho's ``publish(topic, payload, 0, properties=...)`` for MQTT 5 with the user
        properties ``users`` as the only properties: the same packet, queued and written as
        paho's (at once unless corked)."""
        if not self.fast:
            ps = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            ps.UserProperty = users
            rc: MQTTErrorCode = self.publish(topic.decode(), payload, 0, properties=ps).rc
            return rc
        if self._sock is None:
            return MQTTErrorCode.MQTT_ERR_NO_CONN
        packed = user_properties(users)
        props = _vbi(len(packed)) + packed
        rest = 2 + len(topic) + len(props) + len(payload)
        packet = b"".join((b"\x30", _vbi(rest), _U16.pack(len(topic)), topic, props, payload))
        self._out_packet.append({"command": _PUBLISH, "mid": 0, "qos": 0, "pos": 0,
                                 "to_process": len(packet), "packet": packet,
                                 "info": _NO_WAIT})
        if self._corked:
            return MQTTErrorCode.MQTT_ERR_SUCCESS
        return self.loop_write()

    def _handle_publish(self) -> MQTTErrorCode:
        hook = self.fast_publish
        packet = self._in_packet
        if (hook is not None and self.fast and packet["command"] == _PUBLISH
                and self._protocol == MQTTProtocolVersion.MQTTv5):
            read = read_publish(packet["packet"])
            if read is not None and hook(*read):
                return MQTTErrorCode.MQTT_ERR_SUCCESS
        rc: MQTTErrorCode = super()._handle_publish()
        return rc

    def loop_write(self) -> MQTTErrorCode:
        if self._corked:
            return MQTTErrorCode.MQTT_ERR_SUCCESS
        rc: MQTTErrorCode = super().loop_write()
        return rc

    def _packet_write(self) -> MQTTErrorCode:
        """paho's, after one ``send`` of the PUBLISH packets at the head of the queue (up to
        :data:`SEND_CHUNK` bytes) when there are several: paho then takes each packet's
        bytes from what that send wrote (:meth:`_sock_send`), and sends the rest itself."""
        q = self._out_packet
        if self.fast and len(q) > 1 and self._sent_ahead == 0 and self._sock is not None:
            parts: list[bytes | bytearray] = []
            size = 0
            for p in q:
                if p["command"] & 0xF0 != _PUBLISH or size >= SEND_CHUNK:
                    break
                parts.append(p["packet"][p["pos"]:])
                size += p["to_process"]
            if len(parts) > 1:
                try:
                    self._sent_ahead = self._raw_send(b"".join(parts))
                    self.gathered_sends += 1
                except OSError:  # (BlockingIOError too): paho's own send meets it again
                    self._sent_ahead = 0
        rc: MQTTErrorCode = super()._packet_write()
        return rc

    def _sock_send(self, buf: bytes | bytearray) -> int:
        ahead = self._sent_ahead
        if ahead:
            n = min(ahead, len(buf))
            self._sent_ahead = ahead - n
            return n
        return self._raw_send(buf)

    def _raw_send(self, buf: bytes | bytearray) -> int:
        """Bytes to the socket: through the relay thread's link while it has one (it takes
        them all, or raises the OSError that broke it), else paho's own ``send``."""
        link = self.link
        if link is not None:
            return link.write(buf)
        sent: int = super()._sock_send(buf)
        return sent

    def _sock_close(self) -> None:
        # The link lets the socket go first (the relay thread writes it no more).
        link = self.link
        if link is not None and self._sock is not None:
            self.link = None
            link.close()
        super()._sock_close()

    def buffered(self) -> int:
        """Bytes read from the socket (or handed up by the relay thread) that paho has not
        taken yet."""
        fed = self.fed
        return len(self._rbuf) - self._rpos + (0 if fed is None else len(fed))

    def mid_packet(self) -> bool:
        """paho holds the start of a packet whose rest has not been read."""
        return bool(self._in_packet.get("command"))

    def drop_buffer(self) -> None:
        """Forget what was read (a new connection begins)."""
        self._rbuf, self._rpos = b"", 0
        self._sent_ahead = 0
        self.fed, self.fed_end = None, False

    def _sock_recv(self, bufsize: int) -> bytes:
        if not self.fast:
            data_: bytes = super()._sock_recv(bufsize)
            return data_
        if self._rpos >= len(self._rbuf):
            data = self._recv_chunk(bufsize)
            if len(data) <= bufsize:
                return data
            self._rbuf, self._rpos = data, 0
        pos = self._rpos
        out = self._rbuf[pos:pos + bufsize]
        self._rpos = pos + len(out)
        return out

    def _recv_chunk(self, bufsize: int) -> bytes:
        """What the socket has, up to :data:`RECV_CHUNK` (at least ``bufsize``): read into
        the connection's buffer on a plain socket (paho's ``recv`` otherwise: TLS and
        WebSockets keep their own error handling); while the relay thread reads the socket,
        what it handed up."""
        fed = self.fed
        if fed is not None:
            if fed:
                chunk = bytes(fed)
                fed.clear()
                return chunk
            end = self.fed_end
            if isinstance(end, OSError):
                raise end
            if end:
                return b""
            raise BlockingIOError
        sock = self._sock
        if type(sock) is not socket.socket or bufsize > RECV_CHUNK:
            data: bytes = super()._sock_recv(max(bufsize, RECV_CHUNK))
            return data
        into = self._rinto
        if into is None:
            into = self._rinto = bytearray(RECV_CHUNK)
        n = sock.recv_into(into)
        return bytes(into[:n]) if n else b""

    def _packet_read(self) -> MQTTErrorCode:
        """paho's, with a QoS 0 PUBLISH that :attr:`fast_publish` takes read from the buffer
        at once when it is all there (the socket read first when nothing is buffered):
        paho's way for anything else, and for a packet cut short."""
        hook = self.fast_publish
        if not self.fast or hook is None or self._in_packet["command"] != 0 \
                or self._protocol != MQTTProtocolVersion.MQTTv5:
            return super()._packet_read()
        if self._rpos >= len(self._rbuf):
            try:
                data = self._recv_chunk(1)
            except BlockingIOError:
                return MQTTErrorCode.MQTT_ERR_AGAIN
            except OSError as err:  # (as paho's _packet_read)
                self._easy_log(LogLevel.MQTT_LOG_ERR, "failed to receive on socket: %s", err)
                return MQTTErrorCode.MQTT_ERR_CONN_LOST
            if not data:
                return MQTTErrorCode.MQTT_ERR_CONN_LOST
            self._rbuf, self._rpos = data, 0
        buf, pos = self._rbuf, self._rpos
        end = len(buf)
        if buf[pos] == _PUBLISH:
            size, mult, i = 0, 1, pos + 1
            while i < end and i <= pos + 4:
                b = buf[i]
                size += (b & 127) * mult
                mult <<= 7
                i += 1
                if not b & 128:
                    if i + size <= end:
                        read = read_publish(buf[i:i + size])
                        if read is not None and hook(*read):
                            self._rpos = i + size
                            self.whole_reads += 1
                            with self._msgtime_mutex:
                                self._last_bytes_received = time_func()
                            return MQTTErrorCode.MQTT_ERR_SUCCESS
                    break
        return super()._packet_read()
