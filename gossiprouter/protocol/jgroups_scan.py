"""What the two JGroups scanners share, sans-IO: the items they report and their base.

The scanners are the router's zero-copy readers of a JGroups connection
(:class:`gossiprouter.protocol.jgroups2_scan.Scanner`,
:class:`gossiprouter.protocol.jgroups5_scan.Scanner`). This module holds the kinds of item they
report (:data:`Item`), :class:`ScannerBase` (on protocol/scan.py's ``HeaderCache``) and its
bounds.
"""

from __future__ import annotations

import struct
from typing import Any, TypeVar

from gossiprouter.protocol.scan import HeaderCache

__all__ = [
    "CACHE_MAX",
    "CLOSED",
    "CONTROL",
    "ERROR",
    "HELD",
    "LENGTHS_MAX",
    "OVERSIZED",
    "PARTIAL",
    "U32",
    "Item",
    "ScannerBase",
]

#: Reads a big-endian u32 (frame and payload lengths) in the scanners' hot loops.
U32 = struct.Struct(">I").unpack_from

# A scanner's header cache is cleared when it grows past this: one entry per (group,
# destination, sender) a client sends to is plenty for clusters of hundreds of members, and a
# client cycling through made-up destinations must not grow the router's memory without bound.
CACHE_MAX = 1024
# Distinct header lengths remembered per scanner (each is one slice and dict lookup to try).
LENGTHS_MAX = 16

# What the scanners (``jgroups5_scan.Scanner``, ``jgroups2_scan.Scanner``) report, from their
# method ``scan(data, on_run)``. A run of MESSAGEs goes to
# the caller's ``on_run(head, frames, count)`` callback, called in stream order: ``count`` whole
# MESSAGEs, all with the header ``head`` (the parsed header from the scanner's cache), and
# ``frames`` their bytes in the receivers' wire form; it returns True to stop the scan. Runs are
# the hot path, where a call is cheaper than a generator's yield and resume. Everything else is
# yielded as one tuple ``(kind, start, end, count, head)``, in stream order. The scan stops when
# ``on_run`` returns True and after the items marked "last" below. The caller may stop iterating
# at any item (``end`` is where to resume) and may call ``registered`` while it handles a
# CONTROL item.
#: One frame (5.x: ``data[start:end]``, for the full decoder) or one decoded object (2.12:
#: ``head`` is the event, ``end`` where it stopped) that is not a plain MESSAGE. The scanner
#: reads its ``max_frame`` again afterwards, so the handler may change it.
CONTROL = 1
#: A frame above ``max_frame`` starts at ``start`` and ends at ``end`` (possibly past the chunk:
#: the scan then stops); ``count`` is the size to report. The scan goes on after it.
OVERSIZED = 2
#: The chunk ends inside the frame at ``start``, which needs ``end - start`` bytes in all;
#: ``count`` is 1 when that length covers the whole frame (it can be skipped unbuffered), 0 when
#: only the next header field is known (2.12). Last item.
PARTIAL = 3
#: 2.12: the decoder holds an incomplete object of ``count`` bytes until the next chunk. Last.
HELD = 4
#: 5.x: the peer's graceful close marker (the length -5) at ``start``. Last item.
CLOSED = 5
#: The stream is unusable: ``head`` is the ProtocolError. Last item.
ERROR = 6

#: One scanner item, as above.
Item = tuple[int, int, int, int, Any]

_R = TypeVar("_R")


class ScannerBase(HeaderCache[_R]):
    """What both JGroups scanners share: the MESSAGE header cache (:class:`HeaderCache` of
    protocol/scan.py, bounded by CACHE_MAX and LENGTHS_MAX: the exact header bytes, type byte
    included, to what the scanner parsed from them), the namespace ``prefix`` of the groups,
    and ``max_frame``, the connection's current limit on one frame (raised by
    :meth:`registered`; read again after every CONTROL item).
    """

    def __init__(self, prefix: str, max_frame: int) -> None:
        super().__init__(CACHE_MAX, LENGTHS_MAX)
        self.prefix = prefix
        self.max_frame = max_frame

    def registered(self, max_frame: int) -> None:
        """The connection registered its first member: frames up to ``max_frame`` are taken
        from now on (called by the session while it handles a CONTROL item)."""
        self.max_frame = max_frame
