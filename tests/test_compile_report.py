"""The summary's compile report: where compilation's time went, and whether Inductor's on-disk cache served it."""

import torch
from torch import nn

from drivebench.accel.compile import compile_report


def _compile_and_step(cache_dir, monkeypatch) -> dict:
    import torch._dynamo

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache_dir))
    torch._dynamo.reset()  # fresh timers and counters, as in a new process
    torch._dynamo.utils.compilation_time_metrics.clear()
    torch._dynamo.utils.counters.clear()
    net = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))
    net.compile()
    net(torch.randn(4, 8)).sum().backward()
    return compile_report()


def test_compile_report_times_the_compilation_and_counts_cache_hits(tmp_path, monkeypatch):
    cold = _compile_and_step(tmp_path, monkeypatch)
    assert cold["graphs"] == 1 and cold["graph_breaks"] == 0
    seconds = cold["compile_s"]
    assert seconds["total"] > 0 and seconds["inductor"] > 0
    assert seconds["total"] >= seconds["frames"] >= 0
    assert cold["fx_graph_cache"]["misses"] >= 1 and cold["fx_graph_cache"]["hits"] == 0

    warm = _compile_and_step(tmp_path, monkeypatch)  # the same graphs again, on the cache the first left
    assert warm["fx_graph_cache"]["hits"] + warm["aot_autograd_cache"]["hits"] >= 1
    assert warm["fx_graph_cache"]["misses"] == 0
