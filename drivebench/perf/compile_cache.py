"""Whether a run's compile started cold or warm, from the summary's compile report (no torch needed:
the report command reads it too)."""

from __future__ import annotations

from typing import Any

COLD_BELOW, WARM_ABOVE = 0.25, 0.75  # share of FX graphs served by the on-disk cache


def graphs_from_cache(report: Any) -> tuple[int, int] | None:
    """(graphs Inductor's on-disk cache served, graphs looked up) from a compile report, or None where the
    run compiled nothing or its summary predates the counts."""
    if not isinstance(report, dict) or not isinstance(report.get("fx_graph_cache"), dict):
        return None
    hits, misses = (int(report["fx_graph_cache"].get(k) or 0) for k in ("hits", "misses"))
    return (hits, hits + misses) if hits + misses else None


def compile_cache_state(report: Any) -> str | None:
    """``cold`` (under a quarter of the graphs came from Inductor's on-disk cache), ``warm`` (over three
    quarters), ``partly warm``, or None (see :func:`graphs_from_cache`).
    Shares, not all-or-none: a cold run hits the cache for graphs it compiled itself earlier, and a warm
    one misses for shapes the run that filled the cache never met."""
    counts = graphs_from_cache(report)
    if counts is None:
        return None
    share = counts[0] / counts[1]
    return "cold" if share < COLD_BELOW else "warm" if share > WARM_ABOVE else "partly warm"
