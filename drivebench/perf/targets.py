"""Quality targets: ``val/minFDE<=2.0``, or relative to another logged metric, ``val/minFDE<=0.5*val/cv_minFDE``.

A run records the targets it is meant to reach (``bench.targets`` -> ``summary.json`` ``targets``)
and the report computes the time to each (``--target`` gives more). Kept free of pandas so that a run
can check its targets before any work.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from typing import Callable

OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}
_TARGET = re.compile(r"^\s*(?P<metric>[^<>=\s*]+)\s*(?P<op><=|>=|<|>)\s*(?P<value>[-+0-9.eE]+)"
                     r"(?:\s*\*\s*(?P<reference>[^<>=\s*]+))?\s*$")
FORM = "METRIC<=VALUE or METRIC<=FACTOR*OTHER_METRIC (also >=, <, >), e.g. val/minFDE<=2.0 or val/minFDE<=0.5*val/cv_minFDE"


@dataclass(frozen=True)
class Target:
    """Met at the first logged value of ``metric`` that satisfies ``op`` against the threshold.

    The threshold is ``value``, or ``value`` times ``reference`` logged at the same step (a baseline
    the run computes itself, such as QCNet's constant-velocity ``cv_minFDE``).
    """

    metric: str
    op: str
    value: float
    value_text: str = ""  # the number as the user wrote it, so column names echo the command line
    reference: str | None = None

    @property
    def label(self) -> str:
        number = self.value_text or repr(self.value)
        return f"{self.metric}{self.op}{number}" + (f"*{self.reference}" if self.reference else "")

    def threshold(self, reference_value: float | None = None) -> float:
        if self.reference is None:
            return self.value
        if reference_value is None or not math.isfinite(reference_value):
            return math.nan
        return self.value * reference_value

    def met(self, value: float, reference_value: float | None = None) -> bool:
        threshold = self.threshold(reference_value)
        return not math.isnan(threshold) and OPS[self.op](value, threshold)


def parse_target(text: str) -> Target:
    """``METRIC<=VALUE`` or ``METRIC<=FACTOR*OTHER`` (also >=, <, >); ValueError naming the text otherwise."""
    match = _TARGET.match(str(text))
    if match is None:
        raise ValueError(f"target {text!r} is not {FORM}")
    try:
        value = float(match["value"])
    except ValueError:
        raise ValueError(f"target {text!r}: {match['value']!r} is not a number") from None
    return Target(match["metric"], match["op"], value, match["value"], match["reference"])
