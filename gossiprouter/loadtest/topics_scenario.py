"""The topic-multicast load test's scenario: a TOML file with ``kind = "topics"``.

``scripts/scenarios/topics.toml`` is one: ``routers`` routers federated through a mosquitto,
``[topics]`` ``publishers`` and ``subscribers`` per router, the publication ``rate`` and the
``global`` share, the payload ``size``, the subscribers' wildcard ``patterns`` (``{p}``: a
publisher index) and how often they change one (``churn_interval``, ``settle``), and the
``[thresholds]`` the analysis holds the run to. :func:`load_topics_scenario` reads and checks
it (:class:`TopicsScenarioError`, one line); the run is :mod:`gossiprouter.loadtest.topics`.
"""

from __future__ import annotations

import struct
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gossiprouter.core.topics import TopicError, parse_topic, pattern
from gossiprouter.loadtest.scenario_checks import ScenarioError
from gossiprouter.loadtest.scenario_file import parse_thresholds

__all__ = ["STAMP", "TopicsScenario", "TopicsScenarioError", "is_topics_scenario",
           "load_topics_scenario"]

# The start of every publication's payload: publisher index, sequence, send time (trio
# clock); a payload size holds at least that.
STAMP = struct.Struct(">IId")


class TopicsScenarioError(ValueError):
    """A bad scenario: one line naming the key and what was expected."""


@dataclass(frozen=True)
class TopicsScenario:
    name: str
    duration: float
    drain: float
    seed: int
    routers: int
    publishers: int  # per router
    subscribers: int  # per router
    rate: float  # publications per second per publisher
    global_share: float
    size: int
    churn_interval: float  # mean seconds between pattern changes of one subscriber
    settle: float
    patterns: tuple[str, ...]  # with {p}: a publisher index
    # [thresholds] (p99_ms = 50, ...): latency limits the analysis holds the run to.
    thresholds: dict[str, float] = field(default_factory=dict)


def is_topics_scenario(path: Path) -> bool:
    """True for a readable TOML file with ``kind = "topics"`` (the other load test's
    scenarios have no ``kind``)."""
    try:
        return tomllib.loads(path.read_text()).get("kind") == "topics"
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False


def load_topics_scenario(path: Path) -> TopicsScenario:
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise TopicsScenarioError(f"{path}: {e}") from None
    if raw.get("kind") != "topics":
        raise TopicsScenarioError(f"{path.name}: kind: expected \"topics\", got "
                                  f"{raw.get('kind')!r}")
    t = raw.get("topics", {})

    def num(where: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
        v = where.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            raise TopicsScenarioError(f"{path.name}: {key}: expected a number in "
                                      f"[{lo:g}, {hi:g}], got {v!r}")
        return float(v)

    pats = t.get("patterns", ["v{p}/pos/*"])
    if not isinstance(pats, list) or not pats or not all(isinstance(p, str) for p in pats):
        raise TopicsScenarioError(f"{path.name}: topics.patterns: expected a list of strings")
    for p in pats:
        try:
            pattern(*parse_topic(p.replace("{p}", "0")))
        except TopicError as e:
            raise TopicsScenarioError(f"{path.name}: topics.patterns: {p!r}: {e}") from None
    try:
        thresholds = dict(parse_thresholds(raw.get("thresholds", {}), path.name))
    except ScenarioError as e:
        raise TopicsScenarioError(str(e)) from None
    return TopicsScenario(
        name=str(raw.get("name", path.stem)),
        duration=num(raw, "duration", 10, 0.5, 3600), drain=num(raw, "drain", 2, 0, 60),
        seed=int(num(raw, "seed", 1, 0, 2**31)), routers=int(num(raw, "routers", 2, 1, 8)),
        publishers=int(num(t, "publishers", 2, 1, 100)),
        subscribers=int(num(t, "subscribers", 10, 1, 1000)),
        rate=num(t, "rate", 20, 0.1, 10_000), global_share=num(t, "global", 0.5, 0, 1),
        size=int(num(t, "size", 100, STAMP.size, 1 << 16)),
        churn_interval=num(t, "churn_interval", 1.0, 0.05, 3600),
        settle=num(t, "settle", 0.5, 0, 60), patterns=tuple(pats), thresholds=thresholds)
