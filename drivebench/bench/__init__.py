"""What a run executes, chosen by ``bench=``: train (+ ceiling), ceiling only, loader only."""

from drivebench.bench.runners import CeilingBench, LoaderBench, TrainBench

__all__ = ["CeilingBench", "LoaderBench", "TrainBench"]
