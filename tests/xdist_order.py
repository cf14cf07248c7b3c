"""The order in which ``make test`` hands test files to its xdist workers: the longest first.

Why: ``--dist loadfile`` keeps a file's tests on one worker (each module fixture, often a whole CLI run,
runs once), and xdist's own order puts the files with the most tests first; the files with a few long
CLI tests then came last and one core idled for a minute while the other finished them. Handing out
the longest file first (the classic longest-processing-time rule) leaves only short files for the end.

The seconds come from ``tests/durations.json`` (each file's setup + call + teardown on the 2-core CI
machine), written by ``make test ARGS="--write-durations=tests/durations.json"``. They only order the
work: a stale or missing entry costs balance, never a result; a file without an entry counts its tests
times the mean seconds per test of the files that have one.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")


def read_durations(path: Path = DURATIONS) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def longest_file_first(config: pytest.Config, log, seconds: dict[str, float]):
    """``--dist loadfile``, its files handed out longest first by ``seconds`` (file -> seconds)."""
    from xdist.scheduler import LoadFileScheduling  # here: pytest runs without xdist too

    class LongestFileFirst(LoadFileScheduling):
        ordered = False

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the work queue is complete when the first unit is handed out
                known = [(scope, len(ids)) for scope, ids in self.workqueue.items() if scope in seconds]
                per_test = sum(seconds[s] for s, _ in known) / max(1, sum(n for _, n in known)) if known else 1.0
                cost = {scope: seconds.get(scope, len(ids) * per_test) for scope, ids in self.workqueue.items()}
                self.workqueue = type(self.workqueue)(sorted(self.workqueue.items(), key=lambda u: -cost[u[0]]))
                self.ordered = True
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            # A worker started in place of a crashed one is still collecting: xdist's loadfile would hand it
            # work and fail with KeyError in _assign_work_unit (seen when two workers went down at once); it
            # gets its work when its collection arrives (xdist then schedules every worker again).
            if node in self.registered_collections:
                super()._reschedule(node)

    return LongestFileFirst(config, log)


class DurationWriter:
    """``--write-durations=PATH``: each test file's seconds (all its tests' phases), as JSON, at the end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::", 1)[0]] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.seconds:
            self.path.write_text(json.dumps({k: round(v, 1) for k, v in sorted(self.seconds.items())}, indent=1) + "\n")
