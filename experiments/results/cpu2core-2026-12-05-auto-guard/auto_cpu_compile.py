"""Experiment driver (not product code): accel=auto on the CPU with channels-last and compile allowed as stages,
to compare the graphs an in-run compile builds with those of a run compiled from its start."""
import runpy
import sys

import drivebench.bench.autotune as bench_autotune
from drivebench.accel.autotune import Stage

original = bench_autotune.plan_stages


def plan(caps, numerics):
    planned, not_allowed = original(caps, numerics)
    not_allowed = [n for n in not_allowed if n["stage"] not in ("compile", "channels_last")]
    planned = [s for s in planned if s.knob not in ("compile", "channels_last")]
    planned += [Stage("channels_last", (True, False), live=True), Stage("compile", (False, True), in_run=True)]
    return planned, not_allowed


bench_autotune.plan_stages = plan
sys.argv = ["drivebench", *sys.argv[1:]]
runpy.run_module("drivebench", run_name="__main__")
