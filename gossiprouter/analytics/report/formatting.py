"""How the report writes its figures: latencies in milliseconds (:func:`fmt_ms`, the one
unit of every latency it shows), counts with thousands separators, counted nouns."""

from __future__ import annotations

__all__ = ["counted", "fmt_int", "fmt_ms"]


def counted(count: int, noun: str, plural: str | None = None) -> str:
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def fmt_int(n: int) -> str:
    return f"{n:,}"


def fmt_ms(ns: float) -> str:
    """A latency in milliseconds with 3 significant digits (2 below 0.1 ms is noise on
    any real network), whole milliseconds from 100 ms: ``0.042``, ``1.25``, ``28.6``,
    ``286``, ``1,234``. The one unit of every latency the report shows."""
    ms = ns / 1e6
    if ms >= 100:
        return f"{ms:,.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    if ms >= 1:
        return f"{ms:.2f}"
    if ms >= 0.1:
        return f"{ms:.3f}"
    return f"{ms:.2g}" if ms >= 1e-4 else "0"
