"""Topic multicast: multicast ids, subscription patterns and their index. Pure data, no I/O.

A **multicast id** names one stream of publications (after joynr's stateless
broadcasts): the provider, the broadcast name, and a partition, a list of
strings read as a hierarchy like an MQTT topic::

    ("vehicle-17", "position", ("eu", "de", "munich"))

A **pattern** has the same shape; in it

* ``+`` stands for exactly one level (provider, broadcast, or one partition
  element);
* ``*`` may only be the **last partition element** and stands for any number
  of levels, **zero included**: ``(p, b, ("eu", "*"))`` matches ``(p, b,
  ("eu",))`` as well as ``(p, b, ("eu", "de", "munich"))``. This is MQTT's
  ``#`` (``sport/#`` matches ``sport``), so the bridge maps ``*`` to ``#``.

A publication names a concrete id: an element that is exactly ``+`` or ``*``
is refused there. Elements are compared as exact Unicode strings (no
normalisation; NFC and NFD spellings are different topics, as in MQTT).
Every element is non-empty and at most :data:`MAX_ELEMENT` bytes of UTF-8; a
partition has at most :data:`MAX_DEPTH` levels. These bounds keep one
subscription's cost (index nodes, MQTT topic length) small and bounded.

:class:`TopicIndex` holds the subscriptions of one group as a trie over the
levels ``[provider, broadcast, *partition]``, each node with exact children,
one ``+`` child and the members whose pattern ends in ``*`` there. Matching a
publication walks only the branches that can match, so its cost grows with
the depth and the number of matches, not with the number of subscriptions.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

MAX_DEPTH = 32
MAX_ELEMENT = 255
ONE = "+"
ANY = "*"
SCOPES = ("local", "global")

# A multicast id or pattern: (provider, broadcast, partition).
TopicId = tuple[str, str, tuple[str, ...]]

M = TypeVar("M", bound=Hashable)


class TopicError(ValueError):
    """A multicast id or pattern that breaks the rules; the message says which rule."""


def _element(v: object, what: str) -> str:
    if type(v) is not str:
        raise TopicError(f"{what} must be a string, got {type(v).__name__}")
    if not v:
        raise TopicError(f"{what} must not be empty")
    if len(v) > MAX_ELEMENT // 4:
        try:
            n = len(v.encode())
        except UnicodeEncodeError:
            raise TopicError(f"{what} is not valid Unicode (lone surrogate)") from None
        if n > MAX_ELEMENT:
            raise TopicError(f"{what} longer than {MAX_ELEMENT} bytes of UTF-8")
    elif not v.isascii():
        try:
            v.encode()
        except UnicodeEncodeError:
            raise TopicError(f"{what} is not valid Unicode (lone surrogate)") from None
    return v


def _levels(provider: object, broadcast: object, partition: object) -> TopicId:
    if isinstance(partition, str) or not isinstance(partition, Sequence):
        raise TopicError("partition must be a list of strings")
    if len(partition) > MAX_DEPTH:
        raise TopicError(f"partition deeper than {MAX_DEPTH} levels")
    part = tuple(_element(x, f"partition element {i}") for i, x in enumerate(partition))
    return _element(provider, "provider"), _element(broadcast, "broadcast"), part


def topic_id(provider: object, broadcast: object, partition: object = ()) -> TopicId:
    """A validated multicast id (for publishing): no wildcard elements."""
    tid = _levels(provider, broadcast, partition)
    for i, x in enumerate((tid[0], tid[1], *tid[2])):
        if x in (ONE, ANY):
            raise TopicError(
                f"a publication names a concrete id: level {i} is the wildcard {x!r}")
    return tid


def pattern(provider: object, broadcast: object, partition: object = ()) -> TopicId:
    """A validated subscription pattern: ``+`` anywhere, ``*`` only as the last partition
    element."""
    pat = _levels(provider, broadcast, partition)
    if ANY in (pat[0], pat[1]):
        raise TopicError("'*' may only be the last partition element (use '+' for one level)")
    part = pat[2]
    if ANY in part[:-1]:
        raise TopicError("'*' may only be the last partition element")
    return pat


def is_concrete(pat: TopicId) -> bool:
    return ONE not in pat[:2] and ONE not in pat[2] and ANY not in pat[2]


def matches(pat: TopicId, tid: TopicId) -> bool:
    """The rule itself, one pattern against one id (the index's reference, used by tests and
    by the stub, which holds only its own few patterns)."""
    if pat[0] not in (ONE, tid[0]) or pat[1] not in (ONE, tid[1]):
        return False
    pp, tp = pat[2], tid[2]
    if pp and pp[-1] == ANY:
        head = pp[:-1]
        if len(tp) < len(head):
            return False
        return all(a in (ONE, b) for a, b in zip(head, tp, strict=False))
    return len(pp) == len(tp) and all(a in (ONE, b) for a, b in zip(pp, tp, strict=True))


def format_topic(t: TopicId) -> str:
    """A readable form for logs and the CLI: ``provider/broadcast/a/b``."""
    return "/".join((t[0], t[1], *t[2]))


def parse_topic(s: str) -> TopicId:
    """The inverse of :func:`format_topic` for the CLI (elements may not contain ``/``)."""
    parts = s.split("/")
    if len(parts) < 2:
        raise TopicError(f"{s!r}: expected PROVIDER/BROADCAST[/PARTITION...]")
    return parts[0], parts[1], tuple(parts[2:])


# --------------------------------------------------------------------------- the index


@dataclass(eq=False, slots=True)
class _Node(Generic[M]):
    exact: dict[str, _Node[M]] = field(default_factory=dict)
    plus: _Node[M] | None = None
    # Members whose pattern ends exactly here / ends here with a trailing '*'.
    here: set[M] = field(default_factory=set)
    rest: set[M] = field(default_factory=set)

    def empty(self) -> bool:
        return not (self.exact or self.plus or self.here or self.rest)


class TopicIndex(Generic[M]):
    """The subscriptions of one group: member -> patterns, and the trie to match ids.

    A member subscribing to the same pattern twice holds it once (set
    semantics: one UNSUBSCRIBE removes it). :meth:`match` returns each
    member at most once, however many of its patterns match.
    :attr:`counts` is the number of members holding each pattern, so a
    bridge can subscribe upstream to the union, reference-counted.
    """

    def __init__(self) -> None:
        self._root: _Node[M] = _Node()
        self._by_member: dict[M, set[TopicId]] = {}
        self.counts: dict[TopicId, int] = {}

    def __len__(self) -> int:
        """The number of (member, pattern) subscriptions."""
        return sum(len(p) for p in self._by_member.values())

    def __bool__(self) -> bool:
        return bool(self._by_member)

    def patterns_of(self, member: M) -> frozenset[TopicId]:
        return frozenset(self._by_member.get(member, ()))

    def members(self) -> Iterator[M]:
        return iter(self._by_member)

    def subscribe(self, member: M, pat: TopicId) -> bool:
        """Add ``pat`` (already validated by :func:`pattern`) for ``member``; False if it
        held it already. The caller learns that the pattern is new to the group from
        ``counts[pat] == 1``."""
        pats = self._by_member.setdefault(member, set())
        if pat in pats:
            return False
        pats.add(pat)
        self.counts[pat] = self.counts.get(pat, 0) + 1
        node = self._root
        levels = (pat[0], pat[1], *pat[2])
        last = len(levels) - 1
        for i, x in enumerate(levels):
            if i == last and x == ANY:
                node.rest.add(member)
                return True
            if x == ONE:
                if node.plus is None:
                    node.plus = _Node()
                node = node.plus
            else:
                nxt = node.exact.get(x)
                if nxt is None:
                    nxt = node.exact[x] = _Node()
                node = nxt
        node.here.add(member)
        return True

    def unsubscribe(self, member: M, pat: TopicId) -> bool:
        """Remove ``pat`` for ``member``; False if it did not hold it."""
        pats = self._by_member.get(member)
        if pats is None or pat not in pats:
            return False
        pats.discard(pat)
        if not pats:
            del self._by_member[member]
        n = self.counts[pat] - 1
        if n:
            self.counts[pat] = n
        else:
            del self.counts[pat]
        self._unlink(member, pat)
        return True

    def remove_member(self, member: M) -> list[TopicId]:
        """Drop every subscription of ``member`` (it left); the patterns that no member
        holds any more are returned (for upstream unsubscription)."""
        gone: list[TopicId] = []
        for pat in list(self._by_member.get(member, ())):
            self.unsubscribe(member, pat)
            if pat not in self.counts:
                gone.append(pat)
        return gone

    def _unlink(self, member: M, pat: TopicId) -> None:
        levels = (pat[0], pat[1], *pat[2])
        path: list[tuple[_Node[M], str]] = []
        node = self._root
        last = len(levels) - 1
        for i, x in enumerate(levels):
            if i == last and x == ANY:
                node.rest.discard(member)
                break
            path.append((node, x))
            nxt = node.plus if x == ONE else node.exact.get(x)
            assert nxt is not None
            node = nxt
        else:
            node.here.discard(member)
        # Prune the nodes left empty, deepest first, so the trie never keeps dead branches.
        for parent, x in reversed(path):
            child = parent.plus if x == ONE else parent.exact[x]
            if child is not None and not child.empty():
                break
            if x == ONE:
                parent.plus = None
            else:
                del parent.exact[x]

    def match(self, tid: TopicId) -> set[M]:
        """Every member with at least one pattern matching the id ``tid``, once each."""
        out: set[M] = set()
        frontier = [self._root]
        for x in (tid[0], tid[1], *tid[2]):
            nxt: list[_Node[M]] = []
            for node in frontier:
                if node.rest:
                    out |= node.rest
                child = node.exact.get(x)
                if child is not None:
                    nxt.append(child)
                if node.plus is not None:
                    nxt.append(node.plus)
            if not nxt:
                return out
            frontier = nxt
        for node in frontier:
            if node.here:
                out |= node.here
            if node.rest:
                out |= node.rest
        return out

    def all_patterns(self) -> Iterable[TopicId]:
        return self.counts.keys()
