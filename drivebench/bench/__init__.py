"""What a run executes, chosen by ``bench=``: train (+ ceiling), ceiling only, loader only, the accel trial only."""

from drivebench.bench.runners import AutotuneBench, CeilingBench, LoaderBench, TrainBench

__all__ = ["AutotuneBench", "CeilingBench", "LoaderBench", "TrainBench"]
