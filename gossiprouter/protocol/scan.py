"""Zero-copy scanning of received bytes: the pieces every protocol's scanner shares.

Pure functions over ``bytes`` and offsets: nothing here copies a frame, decodes a payload
or knows about routing. The protocols' scanners (in their own modules of this package)
build on them to cut a received chunk into runs of same-header frames and single
control frames.
"""

from __future__ import annotations

__all__ = ["same_frames"]


def same_frames(data: bytes, pos: int, step: int, plen: int, size: int) -> int:
    """How many frames of ``step`` bytes, starting at ``pos``, begin with the same ``plen``
    bytes as the one at ``pos`` (at least 1).

    Equal prefixes (header and payload length) make equally valid frames of the same route, so
    a bulk of equal-size messages needs no Python loop per frame: the j-th byte of every frame
    is one strided slice, and ``lstrip`` counts how many of them match, both at C speed.
    """
    k = (size - pos) // step
    if k <= 1:
        return 1
    span = (k - 1) * step + 1
    for j in range(plen):
        col = data[pos + j : pos + j + span : step]
        rest = len(col.lstrip(col[:1]))
        if rest:
            k = len(col) - rest
            if k == 1:
                return 1
            span = (k - 1) * step + 1
    return k
