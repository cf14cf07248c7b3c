"""Whether a run's compile started cold or warm, from the summary's compile report (no torch needed:
the report command reads it too)."""

from __future__ import annotations

from typing import Any

COLD_BELOW, WARM_ABOVE = 0.25, 0.75  # share of FX graphs served by the on-disk cache


def compile_cache_state(report: Any) -> str | None:
    """``cold`` (under a quarter of the graphs came from Inductor's on-disk cache), ``warm`` (over three
    quarters), ``partly warm``, or None where the run compiled nothing or its summary predates the counts.
    Shares, not all-or-none: a cold run hits the cache for graphs it compiled itself earlier, and a warm
    one misses for shapes the run that filled the cache never met."""
    if not isinstance(report, dict) or not isinstance(report.get("fx_graph_cache"), dict):
        return None
    hits, misses = (int(report["fx_graph_cache"].get(k) or 0) for k in ("hits", "misses"))
    if hits + misses == 0:
        return None
    share = hits / (hits + misses)
    return "cold" if share < COLD_BELOW else "warm" if share > WARM_ABOVE else "partly warm"
