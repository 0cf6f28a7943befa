"""The MQTT topic names of the federation bridge: the mapping of a group's multicast ids and
patterns to MQTT topics and filters, and the names of the federation's own topics.

* **Mapping** (:func:`mqtt_topic`, :func:`mqtt_filter`): the multicast id
  ``(provider, broadcast, partition)`` of group ``group`` is the MQTT topic
  ``{prefix}/{group}/{provider}/{broadcast}/{partition...}``; a pattern maps
  level for level, ``+`` to ``+`` and a trailing ``*`` to ``#``. In a level
  ``/``, ``+``, ``#``, ``%``, control characters and Unicode noncharacters are
  percent-encoded (their UTF-8 bytes: ``%2F``, ``%2B``, ...) and an empty
  level is ``%``, so every level is one MQTT level, never a wildcard, and never
  refused by a broker.
* **Federation topics**, under ``%fed/{prefix}/<router>/``: each router writes only in its
  own subtree (:func:`router_root`): :func:`presence_topic`, :func:`members_topic`,
  :func:`route_topic`, :func:`sync_topic`; :func:`parse_fed_topic` reads them back.

Plain strings, no I/O: :mod:`gossiprouter.federation.bridge` and its parts publish and
subscribe to them.
"""

from __future__ import annotations

import functools
import re

from gossiprouter.core.topics import ANY, TopicError, TopicId, topic_id

FED = "%fed"  # never an escaped group: a bare "%" is always escaped in topic levels


def _escaped(c: str) -> bool:
    """Characters that cannot stand in an MQTT level as they are: the separator and the
    wildcards, the escape character, and what MQTT brokers refuse in topic names (control
    characters, which mosquitto answers by disconnecting, and Unicode noncharacters)."""
    o = ord(c)
    return (c in "%/+#" or o < 0x20 or 0x7F <= o <= 0x9F or 0xFDD0 <= o <= 0xFDEF
            or (o & 0xFFFE) == 0xFFFE)


def escape_level(level: str) -> str:
    """One MQTT topic level for one string: never a wildcard, never splitting, never refused.
    Escaped characters are written as their UTF-8 bytes, ``%XX`` each (upper-case hex)."""
    if not level:
        return "%"
    if level.isascii() and level.isprintable() and not any(c in level for c in "%/+#"):
        return level
    return "".join("".join(f"%{b:02X}" for b in c.encode()) if _escaped(c) else c
                   for c in level)


_PCT = re.compile(r"(?:%[0-9A-F]{2})+")


def unescape_level(level: str) -> str:
    """The inverse of :func:`escape_level`; ValueError for a level it cannot produce."""
    if level == "%":
        return ""
    if "%" not in level:
        out = level
    else:
        try:
            out = _PCT.sub(lambda m: bytes.fromhex(m.group().replace("%", "")).decode(), level)
        except UnicodeDecodeError:
            raise ValueError(f"bad escape in MQTT level {level!r}") from None
    # Only the canonical spelling is accepted, so one id has exactly one topic.
    if escape_level(out) != level:
        raise ValueError(f"not a canonically escaped MQTT level: {level!r}")
    return out


def mqtt_topic(prefix: str, group: str, tid: TopicId) -> str:
    """The MQTT topic of a publication to ``tid`` in ``group``."""
    return "/".join((prefix, escape_level(group), *(escape_level(x) for x in
                                                     (tid[0], tid[1], *tid[2]))))


def mqtt_filter(prefix: str, group: str, pat: TopicId) -> str:
    """The MQTT topic filter of a pattern: ``+`` stays ``+``, a trailing ``*`` becomes ``#``
    (both mean "any number of levels, zero included")."""
    levels = [prefix, escape_level(group)]
    for i, x in enumerate((pat[0], pat[1], *pat[2])):
        if x == "+":
            levels.append("+")
        elif x == ANY and i == len(pat[2]) + 1:
            levels.append("#")
        else:
            levels.append(escape_level(x))
    return "/".join(levels)


def fed_root(prefix: str) -> str:
    """The root of the federation's own topics: ``%fed/{prefix}/``, beside the topic
    publications' ``{prefix}/`` and never inside it, so a broker ACL can let a router write
    topic publications without letting it write any other router's federation topics."""
    return f"{FED}/{prefix}/"


def router_root(prefix: str, origin: str) -> str:
    """Router ``origin``'s subtree: everything it writes, and nothing any other router writes
    (one ACL pattern ``pattern write %fed/{prefix}/%u/#`` confines it there)."""
    return f"{fed_root(prefix)}{escape_level(origin)}/"


def presence_topic(prefix: str, origin: str) -> str:
    """The retained presence of router ``origin`` (its Last Will empties it)."""
    return router_root(prefix, origin) + "presence"


def members_topic(prefix: str, origin: str, group: str, tag: str = "") -> str:
    """The retained record of the members router ``origin`` carries in ``group``: its head
    record, or with ``tag`` one of its chunks (``c<i>``) or delta slots (``d<j>``)."""
    head = f"{router_root(prefix, origin)}members/{escape_level(group)}"
    return f"{head}/{tag}" if tag else head


# A record's chunk or delta slot: the 4th level of a members topic.
_TAG = re.compile(r"[cd](?:0|[1-9][0-9]{0,8})")


@functools.lru_cache(maxsize=4096)  # per routed message: a few destination routers
def route_topic(prefix: str, sender: str, dest: str) -> str:
    """Where router ``sender`` publishes frames for router ``dest`` (in the sender's
    subtree: the topic says who wrote it)."""
    return f"{router_root(prefix, sender)}route/{escape_level(dest)}"


def sync_topic(prefix: str, origin: str) -> str:
    """The marker router ``origin`` sends itself to end a resync."""
    return router_root(prefix, origin) + "sync"


@functools.lru_cache(maxsize=4096)  # per message received: the route topics stay parsed
def parse_fed_topic(prefix: str, topic: str) -> tuple[str, str, str | None, str]:
    """(writer, kind, argument, tag) of a federation topic: the router whose subtree it is
    in, ``presence`` / ``members`` / ``route`` / ``sync``, the group (members) or destination
    router (route), and a record's chunk or delta tag (:func:`members_topic`; "" for the
    head record and every other kind); ValueError for anything else."""
    root = fed_root(prefix)
    if not topic.startswith(root):
        raise ValueError(f"not a federation topic: {topic!r}")
    levels = topic[len(root):].split("/")
    writer = unescape_level(levels[0])
    kind = levels[1] if len(levels) > 1 else ""
    if kind in ("presence", "sync") and len(levels) == 2:
        return writer, kind, None, ""
    if kind in ("members", "route") and len(levels) == 3:
        return writer, kind, unescape_level(levels[2]), ""
    if kind == "members" and len(levels) == 4 and _TAG.fullmatch(levels[3]):
        return writer, kind, unescape_level(levels[2]), levels[3]
    raise ValueError(f"unknown federation topic {topic!r}")


def parse_mqtt_topic(prefix: str, topic: str) -> tuple[str, TopicId]:
    """(group, multicast id) of a bridged publication's topic; ValueError if it is not one."""
    levels = topic.split("/")
    if len(levels) < 4 or levels[0] != prefix:
        raise ValueError(f"not a gossiprouter topic: {topic!r}")
    try:
        group, provider, broadcast, *part = (unescape_level(x) for x in levels[1:])
        return group, topic_id(provider, broadcast, part)
    except TopicError as e:
        raise ValueError(f"{topic!r}: {e}") from None
