"""The checks every table of a scenario file goes through, and the one error they raise.

Every mistake in a scenario raises :class:`ScenarioError`, whose message is one line naming
the file, the key, the value found and what was expected, e.g.
``small.toml: send.rate: expected a number > 0 or "max", got -5``. :class:`Checker` holds
the checks that build those lines (numbers in a range, integers, choices, tables, unknown
keys); the readers of a scenario file build on it: the ROUTE load test's
(:mod:`gossiprouter.loadtest.scenario_file`), its ``[[attacks]]``
(:mod:`gossiprouter.loadtest.attacks.spec`) and the ``[thresholds]`` of either kind.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Checker", "ScenarioError", "is_int", "is_number", "show"]


class ScenarioError(ValueError):
    """A scenario that cannot be used. The message is one line: file, key, value, expected."""


def show(value: Any) -> str:
    """A short rendering of a bad value for an error message."""
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list) and len(repr(value)) > 60:
        return f"a list of {len(value)} values"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_number(value: Any) -> bool:
    # TOML booleans are Python bools, which are ints: a rate of ``true`` is a mistake.
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Checker:
    """The checks of the values of one scenario file, ``source`` (its name, for the errors)."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, key: str, expected: str, value: Any) -> ScenarioError:
        return ScenarioError(f"{self.source}: {key}: expected {expected}, got {show(value)}")

    def fail(self, key: str, message: str) -> ScenarioError:
        return ScenarioError(f"{self.source}: {key}: {message}")

    def check_keys(self, table: Mapping[str, Any], where: str, allowed: Sequence[str]) -> None:
        for key in table:
            if key not in allowed:
                place = f" in {where}" if where else ""
                raise ScenarioError(
                    f"{self.source}: unknown key {key!r}{place} "
                    f"(expected one of: {', '.join(allowed)})")

    def table(self, data: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
        value = data.get(key, {})
        if not isinstance(value, Mapping):
            raise self.error(path, "a table", value)
        return value

    def number(self, data: Mapping[str, Any], key: str, path: str, default: float | None, *,
               low: float, high: float, low_open: bool = False) -> float:
        if key not in data:
            if default is None:
                raise self.fail(path, "missing (a number of seconds is required)")
            return default
        value = data[key]
        low_s = f"> {low:g}" if low_open else f">= {low:g}"
        expected = f"a number {low_s} and <= {high:g}"
        if not is_number(value) or not math.isfinite(value):
            raise self.error(path, expected, value)
        if value > high or value < low or (low_open and value == low):
            raise self.error(path, expected, value)
        return float(value)

    def integer(self, data: Mapping[str, Any], key: str, path: str, default: int, *,
                low: int, high: int) -> int:
        value = data.get(key, default)
        if not is_int(value) or not low <= value <= high:
            raise self.error(path, f"an integer from {low} to {high}", value)
        return int(value)

    def choice(self, data: Mapping[str, Any], key: str, path: str, default: str,
               choices: Sequence[str]) -> str:
        value = data.get(key, default)
        if value not in choices or not isinstance(value, str):
            raise self.error(path, "one of " + ", ".join(f'"{c}"' for c in choices), value)
        return value
