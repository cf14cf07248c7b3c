"""`python -m drivebench.doctor` on this GPU-less machine, and fabricated failures it must catch."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import runpy
import sys
from pathlib import Path

import pytest

from drivebench.doctor import extensions, memory, probe, versions
from drivebench.doctor.cli import main
from drivebench.doctor.context import build_context
from drivebench.doctor.registry import CHECKS
from drivebench.doctor.result import Status

LAUNCHER = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RUN_ID")


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """Caches and the stand-in run dir under tmp_path; no launcher or SLURM variables from outside."""
    monkeypatch.setenv("DRIVEBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    for key in [*LAUNCHER, *(k for k in os.environ if k.startswith("SLURM_"))]:
        monkeypatch.delenv(key, raising=False)


def run_cli(*argv: str, tmp_path: Path) -> tuple[int, dict[str, dict]]:
    out = tmp_path / "doctor.json"
    code = main([*argv, "--skip-slow", "--json", str(out)])
    records = json.loads(out.read_text())["checks"]
    return code, {r["check"]: r for r in records}


def test_cli_default_overrides_fit_to_train_here(tmp_path, capsys):
    code, records = run_cli(tmp_path=tmp_path)
    text = capsys.readouterr().out
    fails = {k: r["saw"] for k, r in records.items() if r["status"] == "FAIL"}
    assert code == 0 and not fails, fails
    assert list(records) == [c.name for c in CHECKS]  # every check, in registry order
    assert records["gpu.inventory"]["status"] == "INFO" and "no GPU" in records["gpu.inventory"]["saw"]
    assert "no GPU" in records["gpu.p2p_copy"]["saw"]
    tv = records["versions.torchvision"]
    assert tv["status"] == "PASS" and "nms loads on cpu" in tv["saw"]
    for slow in ("storage.ckpt_write", "storage.data_read", "gpu.allreduce", "compile.cpu"):
        assert records[slow]["status"] == "INFO" and "skipped" in records[slow]["saw"]
    assert "versions.python" in text and "fit to train" in text
    assert not (tmp_path / "outputs").exists(), "the stand-in run directory must be removed"


def test_json_has_header_and_every_record_field(tmp_path):
    out = tmp_path / "r.json"
    assert main(["--skip-slow", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    machine = payload["header"]["machine"]
    assert {"hostname", "cpu_cores", "gpus", "torch", "shm_gb"} <= set(machine)
    assert payload["header"]["run"]["model"] == "qcnet"
    for record in payload["checks"]:
        assert set(record) == {"check", "status", "saw", "remedy", "data"}
        assert record["status"] in {"PASS", "WARN", "FAIL", "INFO"} and record["saw"]


def test_module_entry_point_exits_with_the_code(tmp_path, monkeypatch, capsys):
    out = tmp_path / "cli.json"
    monkeypatch.setattr(sys, "argv", ["drivebench.doctor", "--skip-slow", "--json", str(out), "dist=ddp",
                                      "dist.devices=4"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_module("drivebench.doctor", run_name="__main__")
    assert stop.value.code == 1
    records = {r["check"]: r for r in json.loads(out.read_text())["checks"]}
    assert records["launcher.devices"]["status"] == "FAIL"
    assert "FAIL  launcher.devices" in capsys.readouterr().out


@pytest.mark.parametrize("override, words", [("model=nope", "nope"), ("accel.num_workers=-1", "accel.num_workers"),
                                             ("model.size=huge", "model.size='huge'")])
def test_config_errors_print_one_line_and_exit_2(override, words, capsys):
    assert main(["--skip-slow", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("drivebench.doctor: error:") and words in err and len(err.splitlines()) == 1


def test_unwritable_ckpt_dir_fails_even_for_root(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code, records = run_cli(f"ckpt.dir={blocker}/sub", tmp_path=tmp_path)
    record = records["storage.ckpt_dir"]
    assert code == 1 and record["status"] == "FAIL"
    assert str(blocker) in record["saw"] and "ckpt.dir=" in record["remedy"]


def test_small_dev_shm_fails_with_shm_size_remedy(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "shm_usage", lambda: (64 * 2**20, 60 * 2**20))  # docker's default
    code, records = run_cli("accel.num_workers=8", tmp_path=tmp_path)
    record = records["memory.shm"]
    assert code == 1 and record["status"] == "FAIL"
    assert "--shm-size=" in record["remedy"] and "accel.num_workers" in record["remedy"]
    assert record["data"]["loader_bytes"] > 60 * 2**20


def test_large_enough_shm_passes_and_zero_workers_need_none(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "shm_usage", lambda: (64 * 2**20, 60 * 2**20))
    code, records = run_cli("accel=none", tmp_path=tmp_path)
    assert records["memory.shm"]["status"] == "PASS" and records["memory.shm"]["data"]["loader_bytes"] == 0


def test_missing_torchvision_is_reported_not_raised(tmp_path, monkeypatch):
    real = probe.import_module

    def no_torchvision(name):
        if name.split(".")[0] == "torchvision":
            raise ImportError("operator torchvision::nms does not exist")
        return real(name)

    monkeypatch.setattr(probe, "import_module", no_torchvision)
    code, records = run_cli(tmp_path=tmp_path)
    record = records["versions.torchvision"]
    assert code == 1 and record["status"] == "FAIL"
    assert "torchvision::nms does not exist" in record["saw"]
    assert "pip install torchvision==0." in record["remedy"]


class _BrokenExtension(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``flash_attn`` and fails to load it the way a wheel built for another torch does."""

    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name == "flash_attn" else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise ImportError("/venv/flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so: undefined symbol: "
                          "_ZN3c104cuda9SetDeviceEi")


def test_flash_attn_abi_mismatch_fails_with_reinstall_remedy(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "meta_path", [_BrokenExtension(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    code, records = run_cli(tmp_path=tmp_path)
    record = records["extensions.flash_attn"]
    assert code == 1 and record["status"] == "FAIL"
    assert "undefined symbol" in record["saw"] and "ABI mismatch" in record["saw"]
    assert "--no-build-isolation" in record["remedy"] and "scaled_dot_product_attention" in record["remedy"]


def test_mmcv_lite_is_info_and_broken_ops_fail(tmp_path, monkeypatch):
    import types

    ctx = build_context([], skip_slow=True)
    fake = types.ModuleType("mmcv")
    fake.__version__ = "2.1.0"
    real = probe.import_module

    def importer(ext_error):
        def fake_import(name):
            if name == "mmcv":
                return fake
            if name == "mmcv._ext":
                raise ext_error
            return real(name)
        return fake_import

    lite = ModuleNotFoundError("No module named 'mmcv._ext'", name="mmcv._ext")
    monkeypatch.setattr(probe, "import_module", importer(lite))
    assert extensions.mmcv_check(ctx).status is Status.INFO
    abi = ImportError("_ext.cpython-311-x86_64-linux-gnu.so: undefined symbol: _ZNK2at6Tensor7is_cudaEv")
    monkeypatch.setattr(probe, "import_module", importer(abi))
    result = extensions.mmcv_check(ctx)
    assert result.status is Status.FAIL and "ABI mismatch" in result.saw and "MMCV_WITH_OPS=1" in result.remedy


def test_known_bad_version_pairs(monkeypatch):
    ctx = build_context([], skip_slow=True)
    fake = {"pyarrow": "26.0.0", "numpy": "1.26.4", "nuscenes-devkit": "1.2.0"}
    monkeypatch.setattr(versions, "installed_version", lambda dist: fake.get(dist))
    result = versions.pyarrow_version(ctx)
    assert result.status is Status.FAIL and "pyarrow<26" in result.remedy
    fake.update(pyarrow="25.0.1", numpy="2.1.0")
    assert versions.pyarrow_version(ctx).status is Status.PASS
    result = versions.nuscenes_version(ctx)
    assert result.status is Status.WARN and "numpy < 2" in result.saw


@pytest.mark.parametrize("version, status", [((3, 9, 18), Status.FAIL), ((3, 10, 14), Status.WARN), ((3, 10, 15), Status.PASS),
                                             ((3, 11, 7), Status.WARN), ((3, 11, 10), Status.PASS), ((3, 12, 0), Status.PASS)])
def test_python_releases_that_can_deadlock_a_forked_loader_worker_are_warned(version, status):
    result = versions.python_version(build_context([], skip_slow=True), version_info=version)
    assert result.status is status, result.saw
    if status is Status.WARN:
        assert "gh-112275" in result.saw and "3.1" in result.remedy


@pytest.mark.parametrize("env, fragment", [
    ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK=3 is not below WORLD_SIZE=2"),
    ({"LOCAL_RANK": "1"}, "missing"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h",
      "MASTER_PORT": "29500"}, "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"),
])
def test_inconsistent_launcher_variables_fail(tmp_path, monkeypatch, env, fragment):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code, records = run_cli(tmp_path=tmp_path)
    record = records["launcher.env"]
    assert code == 1 and record["status"] == "FAIL" and fragment in record["saw"]
    assert "torchrun" in record["remedy"] and "unset" in record["remedy"]


def test_consistent_torchrun_environment_passes(tmp_path, monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    code, records = run_cli(tmp_path=tmp_path)
    assert records["launcher.env"]["status"] == "PASS" and records["launcher.devices"]["status"] == "PASS"


def test_torchrun_processes_must_match_devices(tmp_path, monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    code, records = run_cli("dist=single", tmp_path=tmp_path)
    assert code == 1 and "LOCAL_WORLD_SIZE=2" in records["launcher.devices"]["saw"]


def test_ddp_on_four_devices_without_gpu_fails(tmp_path):
    code, records = run_cli("dist=ddp", "dist.devices=4", tmp_path=tmp_path)
    record = records["launcher.devices"]
    assert code == 1 and record["status"] == "FAIL" and "no GPU" in record["saw"]
    assert "dist.devices=1" in record["remedy"]


def test_cpu_processes_are_fine_when_asked_for(tmp_path):
    code, records = run_cli("dist=ddp", "dist.devices=2", "machine.accelerator=cpu", tmp_path=tmp_path)
    assert records["launcher.devices"]["status"] == "PASS"


def test_slurm_task_layout_must_match_devices(tmp_path, monkeypatch):
    for key, value in {"SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "train", "SLURM_NTASKS": "4",
                       "SLURM_NTASKS_PER_NODE": "4", "SLURM_NNODES": "1", "SLURM_PROCID": "0",
                       "SLURM_LOCALID": "0"}.items():
        monkeypatch.setenv(key, value)
    code, records = run_cli(tmp_path=tmp_path)
    record = records["launcher.slurm"]
    assert record["status"] == "FAIL" and record["data"]["lightning_detects_slurm"] is True
    assert "SLURM_NTASKS_PER_NODE=4 but dist.devices resolves to 1" in record["saw"]
    monkeypatch.setenv("SLURM_JOB_NAME", "bash")  # interactive: Lightning ignores SLURM
    code, records = run_cli(tmp_path=tmp_path)
    assert records["launcher.slurm"]["status"] == "INFO" and "'bash'" in records["launcher.slurm"]["saw"]


def test_camera_images_give_a_rough_estimate_that_only_warns(tmp_path, monkeypatch):
    from PIL import Image

    from drivebench.doctor.context import DataLocation

    root = tmp_path / "nuscenes"
    for cam in ("CAM_FRONT", "CAM_BACK"):
        (root / "samples" / cam).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (320, 180)).save(root / "samples" / cam / f"{i}.jpg")
    ctx = build_context(["accel.num_workers=8"], skip_slow=True)
    ctx.memo["data_location"] = DataLocation(root, False, None)
    foot = memory.estimate_footprint(ctx)
    assert foot.rough and foot.sample_bytes == 2 * 3 * 180 * 320 * 4 and foot.cache_bytes == 6 * 3 * 180 * 320
    monkeypatch.setattr(memory, "shm_usage", lambda: (8 * 2**20, 8 * 2**20))
    result = memory.shm_space(ctx)
    assert result.status is Status.WARN and "rough" in result.saw and "--shm-size=" in result.remedy
