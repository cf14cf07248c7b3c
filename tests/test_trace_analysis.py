"""The trace analysis on small hand-made traces whose every figure is worked out by hand."""

import gzip
import json

import pytest

from drivebench.perf.trace_analysis import DATA_WAIT_ANNOTATION, analyse_trace, load_trace, union, gaps, overlap

US = 1e-6


def op(name, ts, dur, tid=1, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def kernel(name, ts, dur, corr):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7,
            "args": {"correlation": corr, "stream": 7, "device": 0}}


def launch(ts, corr):
    return op("cudaLaunchKernel", ts, 10, cat="cuda_runtime", correlation=corr)


def host_events():
    """Two 1000 us steps on the host (thread 1, plus aten::mm on the autograd thread 2)."""
    return [
        op("ProfilerStep#11", 0, 1000, cat="user_annotation"),
        op("ProfilerStep#12", 1000, 1000, cat="user_annotation"),
        op("aten::linear", 10, 100),
        op("aten::addmm", 20, 80),
        op("aten::add", 200, 30),
        op("cudaStreamSynchronize", 400, 300, cat="cuda_runtime"),
        op(DATA_WAIT_ANNOTATION, 1000, 300, cat="user_annotation"),
        op("aten::mm", 1400, 50, tid=2),
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},  # ignored
    ]


def gpu_trace():
    """Kernels k1..k4 launched at 30, 205, 800, 1350 us; the GPU idles
    [0, 50]   : 30 us waiting for the host (k1 launched at 30), 20 us device side (launch latency)
    [600, 820]: k3 launched at 800, just after the sync that drained the queue returned (700):
                200 us synchronisation, 20 us device side
    [900, 1360]: 300 us waiting for data (the loader, 1000-1300), 150 us waiting for the host, 10 us device side
    [1500, 2000]: no kernel follows: 500 us waiting for the host."""
    return {"traceEvents": host_events() + [
        launch(30, 1), launch(205, 2), launch(800, 3), launch(1350, 4),
        kernel("k_gemm", 50, 250, 1), kernel("k_add", 300, 300, 2), kernel("k_gemm", 820, 80, 3),
        kernel("k_relu", 1360, 140, 4),
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#11", "ts": 50, "dur": 900, "pid": 0, "tid": 7},
    ]}


def test_interval_helpers():
    merged = union([(5, 7), (0, 2), (1, 3)])
    assert merged == [(0, 3), (5, 7)]
    assert gaps(merged, -1, 8) == [(-1, 0), (3, 5), (7, 8)]
    assert overlap(merged, 2, 6) == pytest.approx(2.0)


def test_gpu_figures_per_step():
    out = analyse_trace(gpu_trace())
    assert out["steps"] == 2 and out["device"] == "cuda"
    assert out["step_s"]["median"] == pytest.approx(1000 * US)
    gpu = out["gpu"]
    assert gpu["kernels_per_step"] == 2
    assert gpu["active_s_per_step"] == pytest.approx(770 / 2 * US)  # 550 + 80 + 140 us of kernels
    assert gpu["active_fraction"] == pytest.approx(770 / 2000)
    idle = gpu["idle_s_per_step"]
    assert idle["waiting_for_host"] == pytest.approx((30 + 150 + 500) / 2 * US)
    assert idle["synchronisation"] == pytest.approx(200 / 2 * US)
    assert idle["waiting_for_data"] == pytest.approx(300 / 2 * US)
    assert idle["device_side"] == pytest.approx((20 + 20 + 10) / 2 * US)
    assert sum(idle.values()) + gpu["active_s_per_step"] == pytest.approx(1000 * US)
    assert [k["name"] for k in out["top_kernels"]] == ["k_gemm", "k_add", "k_relu"]  # 330, 300, 140 us
    assert out["top_kernels"][0]["calls_per_step"] == 1 and out["top_kernels"][0]["s_per_step"] == pytest.approx(165 * US)


def test_host_figures_per_step():
    host = analyse_trace(gpu_trace())["host"]
    assert host["aten_ops_per_step"] == 1.5  # linear, add, mm: addmm is called from inside linear
    assert host["aten_op_s_per_step"] == pytest.approx((100 + 30 + 50) / 2 * US)  # per thread, then summed
    assert host["launch_calls_per_step"] == 2
    assert host["launch_api_s_per_step"] == pytest.approx(20 * US)
    assert host["sync_calls_per_step"] == 0.5 and host["sync_s_per_step"] == pytest.approx(150 * US)
    # what the steps' own thread did outside any op, launch, sync or annotation
    assert host["outside_ops_s_per_step"] == pytest.approx((560 + 690) / 2 * US)


def test_top_operators_by_self_time():
    ops = {o["name"]: o for o in analyse_trace(gpu_trace())["top_ops"]}
    assert ops["cudaStreamSynchronize"]["self_s_per_step"] == pytest.approx(150 * US)
    assert ops["aten::addmm"]["self_s_per_step"] == pytest.approx(35 * US)  # 80 - its launch
    assert ops["aten::linear"]["self_s_per_step"] == pytest.approx(10 * US)  # 100 - addmm
    assert ops["cudaLaunchKernel"]["calls_per_step"] == 2
    first = analyse_trace(gpu_trace())["top_ops"][0]
    assert first["name"] == "cudaStreamSynchronize"


def test_cpu_trace_says_gpu_figures_are_not_measured():
    cpu_only = [e for e in host_events() if e.get("cat") != "cuda_runtime"]
    out = analyse_trace({"traceEvents": cpu_only})
    assert out["device"] == "cpu"
    assert out["gpu"] is None and "not measured" in out["gpu_note"]
    assert out["top_kernels"] == []
    assert out["host"]["aten_ops_per_step"] == 1.5


def test_exposed_communication_is_nccl_time_not_under_compute():
    trace = {"traceEvents": [op("ProfilerStep#3", 0, 400, cat="user_annotation"), launch(0, 1), launch(5, 2),
                             kernel("k_backward", 10, 100, 1), kernel("ncclDevKernel_AllReduce_Sum_f32", 60, 140, 2)]}
    gpu = analyse_trace(trace)["gpu"]
    assert gpu["comm_kernel_s_per_step"] == pytest.approx(140 * US)
    assert gpu["comm_exposed_s_per_step"] == pytest.approx(90 * US)  # 60-110 overlaps the backward kernel


def test_no_step_windows_is_said():
    out = analyse_trace({"traceEvents": [op("aten::add", 0, 5)]})
    assert out["steps"] == 0 and "ProfilerStep" in out["note"]


def test_load_trace_reads_gzip(tmp_path):
    path = tmp_path / "rank0.pt.trace.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump(gpu_trace(), fh)
    assert analyse_trace(load_trace(path))["gpu"]["kernels_per_step"] == 2
