"""The summary's compile report: where compilation's time went, and whether Inductor's on-disk cache served it."""

import json
import os
import subprocess
import sys

import torch
from omegaconf import OmegaConf
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


def test_compile_cache_auto_keeps_inductor_out_of_tmp_and_a_warm_second_process_hits_it(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys

    from drivebench.accel.compile import INDUCTOR_CACHE_ENV, use_compile_cache

    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    assert use_compile_cache("auto", tmp_path / "cache") == str(tmp_path / "cache" / "inductor")
    assert os.environ[INDUCTOR_CACHE_ENV] == str(tmp_path / "cache" / "inductor")
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv(INDUCTOR_CACHE_ENV, default_cache_dir())  # what torch writes there once asked (Lightning's import)
    assert use_compile_cache("auto", tmp_path / "cache") == str(tmp_path / "cache" / "inductor")
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(tmp_path / "mine"))  # the user's own choice wins under auto and torch
    assert use_compile_cache("auto", tmp_path / "cache") == str(tmp_path / "mine")
    assert use_compile_cache("torch", tmp_path / "cache") == str(tmp_path / "mine")
    assert use_compile_cache(str(tmp_path / "there"), tmp_path / "cache") == str(tmp_path / "there")

    # two processes with the knob's directory: the first fills it, the second compiles nothing new
    code = ("import json, sys, torch, lightning.pytorch\n"
            "from drivebench.accel.compile import use_compile_cache, compile_report\n"
            "use_compile_cache('auto', sys.argv[1])\n"
            "net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1)); net.compile()\n"
            "net(torch.randn(4, 8)).sum().backward()\n"
            "print(json.dumps(compile_report()['fx_graph_cache']))\n")
    env = {k: v for k, v in os.environ.items() if k != INDUCTOR_CACHE_ENV}
    runs = [subprocess.run([sys.executable, "-c", code, str(tmp_path / "shared")], env=env, capture_output=True,
                           text=True, timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:] + runs[1].stderr[-2000:]
    import json

    cold, warm = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert cold["misses"] >= 1 and warm["misses"] == 0 and warm["hits"] >= 1
    assert any((tmp_path / "shared" / "inductor").iterdir())


def test_the_terminal_summary_says_how_long_the_run_compiled_and_from_which_cache():
    from drivebench.perf.summary import render_table

    cold = {"settings": {"compile_report": {"graphs": 21, "compile_s": {"total": 168.2},
                                            "fx_graph_cache": {"hits": 2, "misses": 40}}}}
    assert "compiling" in render_table(cold) and "168 s in this run, cold cache (2 of 42 graphs from it)" in render_table(cold)
    warm = {"settings": {"compile_report": {"compile_s": {"total": 38.0}, "fx_graph_cache": {"hits": 36, "misses": 6}}}}
    assert "38 s in this run, warm cache (36 of 42 graphs from it)" in render_table(warm)
    assert "compiling" not in render_table({"settings": {}})  # nothing compiled: no row
    assert "recompile" not in render_table(warm)
    warm["settings"]["compile_report"]["recompiles"] = {"count": 2, "frames": []}
    assert "; 2 recompiles (why: summary.json settings.compile_report.recompiles)" in render_table(warm)


def test_the_compile_report_counts_recompiles_and_says_why():
    """A new batch size, a changed autocast and a new layout each compile the frame again; the report counts them
    and names each reason once (dynamo lists a failure per cached graph it checked)."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.compilation_time_metrics.clear()
    net = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))
    net.compile(backend="eager")  # guards and recompiles are dynamo's: no Inductor needed
    net(torch.randn(4, 8)).sum().backward()
    assert compile_report()["recompiles"] == {"count": 0, "frames": []}
    net(torch.randn(6, 8)).sum().backward()  # a new size: compiled again, now dynamic in it
    net(torch.randn(7, 8)).sum().backward()  # served by the dynamic graph
    with torch.autocast("cpu", dtype=torch.bfloat16):
        net(torch.randn(7, 8)).sum().backward()
    net(torch.randn(8, 7).t()).sum().backward()  # the same size, another stride
    report = compile_report()["recompiles"]
    assert report["count"] == 3 and len(report["frames"]) == 1
    frame = report["frames"][0]
    assert frame["recompiles"] == 3 and len(frame["reasons"]) == 3
    assert "size mismatch" in frame["reasons"][0] and "autocast" in frame["reasons"][1]
    assert "stride mismatch" in frame["reasons"][2]
    compile_s = compile_report()["compile_s"]
    assert len(compile_s["each_frame"]) == 4  # the first compilation and the three again
    # where the frames' seconds went: tracing and guards inside each frame's compilation
    phases = compile_s["phases"]
    assert 0 < phases["dynamo_tracing"] <= compile_s["frames"] and 0 < phases["guards"] <= compile_s["frames"]
    torch._dynamo.reset()


def test_an_interrupted_run_keeps_its_compile_and_cuda_graph_facts(tmp_path):
    """A run stopped by its cap still says where its start went: five QCNet runs capped on an H100 (2026-12-06)
    wrote summaries without their compile report and graph captures, the figures the call was made for."""
    import signal
    import time
    from types import SimpleNamespace

    from drivebench.bench.runners import TrainBench

    graphs = {"graphs": 2, "capture_s": [17.2, 2.4], "padding": {"buckets": 2}}
    module = SimpleNamespace(summary_settings=lambda: {"precision": "bf16-mixed"}, graphed_loss=object(),
                             cuda_graphs_report=lambda: dict(graphs))
    run = SimpleNamespace(cfg=OmegaConf.create({"requeue": False, "ckpt": {"callback": None}}), output_dir=tmp_path,
                          started=time.time() - 60.0, autotune=None, module=module, compiled_units=["net"],
                          cuda_graphs="on")
    bench = TrainBench()
    bench.stopped, bench._trainer, bench._phase = None, None, "training"
    bench._interrupted(run, None, {"run": {}, "paths": {}, "settings": {}}, signal.SIGTERM)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["run"]["status"] == "interrupted"
    assert written["settings"]["cuda_graphs"] == {"status": "on", **graphs}
    assert written["settings"]["precision"] == "bf16-mixed"
    assert {"graphs", "compile_s", "fx_graph_cache"} <= set(written["settings"]["compile_report"])

    def broken() -> dict:
        raise RuntimeError("stopped mid-capture")

    module.cuda_graphs_report = broken  # the facts fail: the summary of the stopped run is still written
    (tmp_path / "summary.json").unlink()
    bench._interrupted(run, None, {"run": {}, "paths": {}, "settings": {}}, signal.SIGTERM)
    assert json.loads((tmp_path / "summary.json").read_text())["run"]["status"] == "interrupted"


def test_shape_profile_key_names_the_setup_and_changes_with_what_fixes_shapes():
    from test_accel_settings import machine, preset

    from drivebench.accel.compile import shape_profile_key
    from drivebench.accel.settings import AccelSettings

    settings = AccelSettings.resolve(preset("none"), machine(0, 2))  # the composed preset, as a run resolves it
    model = {"name": "qcnet", "size": "paper", "batch_size": 4, "net": {"hidden": 128}, "optimizer": {"lr": 5e-4}}
    key = shape_profile_key(model, settings)
    assert key.startswith("drivebench-qcnet-paper-b4-32-true-")
    assert shape_profile_key({**model, "optimizer": {"lr": 1e-3}}, settings) == key  # the schedule fixes no shape
    assert shape_profile_key({**model, "size": "test"}, settings) != key
    assert shape_profile_key({**model, "net": {"hidden": 32}}, settings) != key
    settings.cuda_graphs = "on"
    assert shape_profile_key(model, settings) != key


def test_use_shape_profile_sets_and_clears_its_own_job_id_and_leaves_a_users_alone():
    from drivebench.accel.compile import use_shape_profile

    # torch's config patch restores the value (monkeypatch would delete the config entry on undo)
    with torch.compiler.config.patch(job_id=None):
        assert use_shape_profile("drivebench-a") == "drivebench-a" == torch.compiler.config.job_id
        assert use_shape_profile("drivebench-b") == "drivebench-b"  # the next run in this process (a multirun)
        assert use_shape_profile(None) is None and torch.compiler.config.job_id is None
    with torch.compiler.config.patch(job_id="mine"):
        assert use_shape_profile("drivebench-a") == "mine" and use_shape_profile(None) == "mine"
    assert torch.compiler.config.job_id is None


def test_shape_profile_makes_a_later_process_compile_the_varying_dimension_dynamic_at_once(tmp_path):
    """Torch's local PGO under the job id ``use_shape_profile`` sets, on one of QCNet's compile units compiled as
    ``accel.compile`` does (``nn.Module.compile``): a first process compiles static, then dynamic at its second
    batch size (two graphs); a second process on the same cache directory, whose batches come in other sizes,
    compiles the dynamic graph at its first call (one). Without the profile, or under another setup's id, it
    compiles twice again. (Torch keeps the size the profile first saw static, so the second process starts at
    another size, as a run with another seed does.)"""
    code = ("import json, sys, torch\n"
            "from drivebench.accel.compile import use_shape_profile\n"
            "from drivebench.models.qcnet.layers import FourierEmbedding\n"
            "from torch._dynamo.utils import counters\n"
            "assert use_shape_profile(sys.argv[1] or None) == (sys.argv[1] or None)\n"
            "unit = FourierEmbedding(input_dim=2, hidden_dim=16, num_freq_bands=4)\n"
            "unit.compile(backend='eager')\n"
            "for n in [int(n) for n in sys.argv[2].split(',')]: unit(torch.randn(n, 2))\n"
            "print(json.dumps(int(counters['stats']['unique_graphs'])))\n")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}

    def graphs(job: str, sizes: str) -> int:
        run = subprocess.run([sys.executable, "-c", code, job, sizes], env=env, capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        return json.loads(run.stdout.strip().splitlines()[-1])

    assert graphs("", "4,6") == 2 and graphs("", "5,7") == 2
    assert graphs("drivebench-test", "4,6") == 2
    assert graphs("drivebench-test", "5,7") == 1
    assert graphs("drivebench-other", "5,7") == 2


def test_the_end_of_run_validation_runs_as_the_fits_do_under_no_grad(tmp_path):
    """Lightning's fit validates under ``no_grad``; a Trainer's own ``validate`` under inference mode, whose
    tensors fail the compiled units' guards: SparseDrive's end-of-run validation compiled five graphs again
    (a CPU fit at the test size). The bench's end-of-run validation runs as the fit's do."""
    from types import SimpleNamespace

    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from drivebench.bench.runners import TrainBench

    class _Watch(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 1)
            self.modes: list[tuple[bool, bool]] = []

        def validation_step(self, batch, batch_idx):
            self.modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
            self.log("val/loss", self.net(batch[0]).sum())

    class _Data(pl.LightningDataModule):
        def val_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(6, 4)), batch_size=2)

    module = _Watch()
    run = SimpleNamespace(trainer_kwargs=lambda: {"accelerator": "cpu", "devices": 1, "default_root_dir": str(tmp_path)},
                          job=None, module=module, datamodule=_Data())
    metrics = TrainBench(val_batches=2)._validate(run, None, trained_step=5)
    assert "loss" in metrics and module.modes == [(False, False), (False, False)]
