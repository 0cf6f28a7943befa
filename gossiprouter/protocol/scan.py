"""Zero-copy scanning of received bytes: the pieces every protocol's scanner shares.

Pure code over ``bytes`` and offsets: nothing here copies a frame, decodes a payload or
knows about routing. The protocols' scanners (in their own modules of this package)
build on them to cut a received chunk into runs of same-header frames and single
control frames.
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["HeaderCache", "same_frames"]

V = TypeVar("V")


# Frames the first round of same_frames compares: a short run costs about that many frames'
# work, not the rest of the chunk's.
FIRST_ROUND = 16


def same_frames(data: bytes, pos: int, step: int, plen: int, size: int) -> int:
    """How many frames of ``step`` bytes, starting at ``pos``, begin with the same ``plen``
    bytes as the one at ``pos`` (at least 1).

    Equal prefixes (header and payload length) make equally valid frames of the same route, so
    a bulk of equal-size messages needs no Python loop per frame: the j-th byte of every frame
    is one strided slice, and ``lstrip`` counts how many of them match, both at C speed.
    The last frame is compared whole first: if it matches, one round covers every frame, else
    (after comparing the next frame whole) the first round covers :data:`FIRST_ROUND` frames,
    and the rest only if they all match: frames of one size but alternating headers (several
    senders) then cost a comparison or two each, not a pass over the rest of the chunk.
    """
    total = (size - pos) // step
    if total <= 1:
        return 1
    prefix = data[pos : pos + plen]
    if data.startswith(prefix, pos + (total - 1) * step):
        want = total  # the last frame matches: most likely one bulk, counted in one round
    elif not data.startswith(prefix, pos + step):
        return 1
    else:
        want = FIRST_ROUND
    k = 1  # frames known to match
    while k < total:
        hi = want if want < total else total
        # The columns start at frame k - 1, which matches: its byte is every column's model.
        first = pos + (k - 1) * step
        good = hi - k + 1  # of the frames k - 1 .. hi - 1, how many match so far
        span = (good - 1) * step + 1
        for j in range(plen):
            col = data[first + j : first + j + span : step]
            rest = len(col.lstrip(col[:1]))
            if rest:
                good = len(col) - rest
                if good == 1:
                    return k
                span = (good - 1) * step + 1
        k += good - 1
        if k < hi:
            return k
        want = total
    return k


class HeaderCache(Generic[V]):
    """Parsed frame headers by their exact bytes: a scanner's memory of the headers it checked.

    A header is a self-delimiting prefix of its frame (the type, group, addresses...), so if
    the bytes at the start of a frame equal a remembered header, that frame has that header:
    :meth:`find` tries each distinct header length seen (a connection uses few) with one slice
    and one dict lookup, instead of parsing. Both bounds clear or forget old entries, so a peer
    sending ever new headers costs memory and time in proportion to the bounds only.
    """

    __slots__ = ("entries", "lengths", "max_entries", "max_lengths")

    def __init__(self, max_entries: int, max_lengths: int) -> None:
        self.entries: dict[bytes, V] = {}
        self.lengths: list[int] = []
        self.max_entries = max_entries
        self.max_lengths = max_lengths

    def find(self, data: bytes, start: int) -> V | None:
        """The value of the remembered header that ``data[start:]`` begins with, if any."""
        entries = self.entries
        for n in self.lengths:
            hit = entries.get(data[start : start + n])
            if hit is not None:
                return hit
        return None

    def add(self, header: bytes, value: V) -> None:
        """Remember ``header`` (its exact bytes) and what it parses to."""
        entries = self.entries
        if len(entries) >= self.max_entries:
            entries.clear()
            self.lengths.clear()
        entries[header] = value
        n = len(header)
        lengths = self.lengths
        if n not in lengths:
            if len(lengths) >= self.max_lengths:
                lengths.pop(0)
            lengths.append(n)
