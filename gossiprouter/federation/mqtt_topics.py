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
* **Federation topics**, under ``{prefix}/%fed/`` (a level the mapping never produces):
  :func:`presence_topic`, :func:`members_topic`, :func:`route_topic`, :func:`sync_topic`.

Plain strings, no I/O: :mod:`gossiprouter.federation.bridge` and its parts publish and
subscribe to them.
"""

from __future__ import annotations

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


def presence_topic(prefix: str, origin: str) -> str:
    """The retained presence of router ``origin`` (its Last Will empties it)."""
    return f"{prefix}/{FED}/router/{escape_level(origin)}"


def members_topic(prefix: str, origin: str, group: str) -> str:
    """The retained record of the members router ``origin`` carries in ``group``."""
    return f"{prefix}/{FED}/members/{escape_level(origin)}/{escape_level(group)}"


def route_topic(prefix: str, origin: str) -> str:
    """Where frames for router ``origin`` are published."""
    return f"{prefix}/{FED}/route/{escape_level(origin)}"


def sync_topic(prefix: str, origin: str) -> str:
    """The marker router ``origin`` sends itself to end a resync."""
    return f"{prefix}/{FED}/sync/{escape_level(origin)}"


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
