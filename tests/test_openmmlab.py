"""The OpenMMLab bridge with the real stack (mmcv 2.1.0 with CPU ops, mmdet 3.3.0, mmdet3d 1.4.0):
a test-size PointPillars (mmdet3d's nuScenes config) trained under drivebench and under mmengine's runner
on the embedded nuScenes set, the report putting both side by side, the doctor listing the ops, and
the errors a user meets. The session installs the stack if it is missing (tests/openmmlab_setup.py).
The installer's pure parts (C++ standard patch, cache layout, the extra) are tested without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from drivebench.errors import ConfigError
from tests.conftest import REPO, run_cli

CONFIG = "pointpillars_hv_fpn_sbn-all_8xb4-2x_nus-3d"
TEST_SIZE = ["model=mmdet3d", f"model.config={CONFIG}", "model.size=test", "data.size=mini"]


# ---- the installer's pure parts (no OpenMMLab needed) -----------------------------------------------
def test_cxx_standard_patch_only_for_torch_2_14_and_only_gcc_flags(tmp_path: Path):
    from drivebench.openmmlab.install import InstallError, patch_cxx_standard

    setup = tmp_path / "setup.py"
    text = ("extra_compile_args['cxx'] = ['-std=c++14']\nextra_compile_args['cxx'] = ['-std=c++17']\n"
            "extra_compile_args['cxx'] = ['/std:c++17']\n")
    setup.write_text(text)
    assert patch_cxx_standard(setup, "2.13.0+cpu") == 0 and setup.read_text() == text
    assert patch_cxx_standard(setup, "2.14.1+cu130") == 2
    assert setup.read_text().count("-std=c++20") == 2 and "/std:c++17" in setup.read_text()
    setup.write_text("nothing to patch\n")
    with pytest.raises(InstallError, match="patch it by hand"):
        patch_cxx_standard(setup, "2.15.0")


def test_wheel_cache_is_keyed_by_python_torch_and_ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import sys

    import torch

    from drivebench.openmmlab import install

    monkeypatch.setenv("DRIVEBENCH_CACHE", str(tmp_path))
    path = install.wheel_dir()
    assert path.parent == tmp_path / "wheels"
    assert path.name == f"cp{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__}-" + (
        f"cuda{torch.version.cuda}" if install.torch_info()[2] else "cpu")


def test_a_failed_install_step_names_itself_and_shows_its_last_lines(monkeypatch, capsys, tmp_path: Path):
    import sys

    from drivebench.openmmlab import install

    log = tmp_path / "step.log"
    with pytest.raises(install.InstallError) as err:
        install.run([sys.executable, "-c", "print('line one'); print('fatal: no space'); raise SystemExit(3)"],
                    log=log, what="building mmcv 2.1.0")
    text = str(err.value)
    assert text.startswith("building mmcv 2.1.0 failed (exit 3)") and "fatal: no space" in text and str(log) in text

    def broken(**_):
        raise install.InstallError("no C++ compiler found: install one (Debian/Ubuntu: `apt-get install g++`)")

    monkeypatch.setattr(install, "install", broken)
    assert install.main([]) == 1
    assert "[openmmlab] error: no C++ compiler found" in capsys.readouterr().err


def test_extra_lists_the_light_dependencies_and_not_open3d():
    from drivebench.openmmlab.install import extra_requirements

    reqs = extra_requirements()
    names = {r.split("=")[0].split(">")[0].split("<")[0].strip() for r in reqs}
    assert {"mmengine", "mmdet", "trimesh", "numba", "terminaltables"} <= names, reqs
    assert "open3d" not in names and "mmdet3d" not in names  # mmdet3d comes --no-deps from the installer


def test_missing_stack_is_one_config_error_naming_the_installer(monkeypatch: pytest.MonkeyPatch):
    import importlib.util

    import drivebench.openmmlab as om

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mmdet3d" else real(name, *a))
    with pytest.raises(ConfigError) as err:
        om.require()
    text = str(err.value)
    assert "\n" not in text and "mmdet3d" in text and "python -m drivebench.openmmlab.install" in text


# ---- configs, presets, errors ------------------------------------------------------------------------
@pytest.mark.openmmlab
@pytest.mark.usefixtures("openmmlab_stack")
def test_config_names_resolve_and_unknown_names_list_close_matches():
    from drivebench.openmmlab.configs import list_configs, resolve_config

    path = resolve_config(CONFIG)
    assert path.name == f"{CONFIG}.py" and "_base_" not in path.parts
    assert CONFIG in list_configs("pointpillars")
    with pytest.raises(ConfigError, match="close matches: .*pointpillars_hv_fpn_sbn-all_8xb4-2x_nus-3d"):
        resolve_config("pointpillars_hv_fpn_sbn-all_8xb4-2x_nus3d")
    with pytest.raises(ConfigError, match="no such file"):
        resolve_config("/nowhere/config.py")


@pytest.mark.openmmlab
@pytest.mark.usefixtures("openmmlab_stack")
def test_test_preset_keeps_pointpillars_consistent_and_user_options_win():
    from drivebench.openmmlab.configs import load_config
    from drivebench.openmmlab.module import build_net

    full = load_config(CONFIG, "config")
    small = load_config(CONFIG, "test", {"model.pts_bbox_head.feat_channels": 32})
    assert full.model.pts_middle_encoder.output_shape == [400, 400]
    assert small.model.pts_middle_encoder.output_shape == [100, 100]
    assert small.model.data_preprocessor.voxel_layer.voxel_size == small.model.pts_voxel_encoder.voxel_size == [1.0, 1.0, 8]
    assert small.model.pts_neck.in_channels == small.model.pts_backbone.out_channels == [16, 32, 64]
    assert small.model.pts_bbox_head.feat_channels == 32  # cfg_options after the preset
    assert small.param_scheduler[0].end == 10 and full.param_scheduler[0].end == 1000
    n_full = sum(p.numel() for p in build_net(CONFIG, "config").parameters())
    n_small = sum(p.numel() for p in build_net(CONFIG, "test").parameters())
    assert n_small < n_full / 10, (n_small, n_full)


def test_half_arguments_reach_float32_only_code_as_float32():
    import torch

    from drivebench.openmmlab.amp import HALF_TYPES, float32_for

    seen = []
    op = float32_for(lambda *a, **k: seen.append([x.dtype for x in (*a, *k.values()) if torch.is_tensor(x)]))
    op(torch.ones(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.long), 2.0, w=torch.ones(1, dtype=torch.bfloat16))
    op(torch.ones(2, dtype=torch.float16), torch.ones(2))
    assert seen == [[torch.float32, torch.long, torch.float32], [torch.float16, torch.float32]]
    assert float32_for(op) is op  # wrapping twice is a no-op
    float32_for(lambda x: seen.append(x.dtype), HALF_TYPES)(torch.ones(1, dtype=torch.float16))
    assert seen[-1] == torch.float32


@pytest.mark.openmmlab
@pytest.mark.usefixtures("openmmlab_stack")
def test_pointpillars_trains_under_bf16_autocast(drivebench_cache: Path, tmp_path: Path):
    """mmdet3d's naiveSyncBN2d asserts float32 input: under autocast it stopped the first step (H200, part
    11), on the CPU too. Registering mmdet3d wraps it (and mmcv's focal-loss op) to take float32."""
    import mmdet.models.losses.focal_loss as focal
    from mmdet3d.models.layers import norm

    from drivebench.openmmlab import register_mmdet3d

    register_mmdet3d()
    assert focal._sigmoid_focal_loss._drivebench_float32_for and norm.NaiveSyncBatchNorm2d.forward._drivebench_float32_for
    proc = run_cli([*TEST_SIZE, "accel=none", "accel.precision=bf16-mixed", "bench.steps=3", "bench.warmup_steps=1",
                    "bench.ceiling=false", "bench.val_batches=0", "ckpt=none", f"hydra.run.dir={tmp_path}"],
                   drivebench_cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["settings"]["accel"]["precision"] == "bf16-mixed" and s["loss"]["nonfinite_steps"] == 0, s["settings"]


@pytest.mark.openmmlab
@pytest.mark.usefixtures("openmmlab_stack")
def test_compile_scope_picks_what_accel_compile_compiles():
    from drivebench.openmmlab.module import build_net

    assert build_net(CONFIG, "test").compile_units() == {}  # default: slower compiled on the H200
    assert set(build_net(CONFIG, "test", compile_scope="dense").compile_units()) == {
        "pts_backbone", "pts_neck", "pts_bbox_head"}
    with pytest.raises(ConfigError, match="compile_scope='all' is not valid; choose one of: none, dense"):
        build_net(CONFIG, "test", compile_scope="all")


@pytest.mark.openmmlab
@pytest.mark.usefixtures("openmmlab_stack")
@pytest.mark.parametrize("voxel_size, max_points, max_voxels", [
    ([0.25, 0.25, 8.0], 64, (30000, 40000)),  # nuScenes PointPillars' settings
    ([4.0, 4.0, 8.0], 5, (300, 400)),         # full voxels and the voxel limit both bite
    ([1.0, 1.0, 1.0], 3, (100000, 100000)),
])
def test_sorted_voxelization_gives_mmcvs_voxels(voxel_size, max_points, max_voxels):
    import torch
    from mmcv.ops import Voxelization

    from drivebench.openmmlab.voxelize import SortedVoxelization

    generator = torch.Generator().manual_seed(0)
    points = torch.rand(20000, 5, generator=generator)
    points[:, :2] = points[:, :2] * 120 - 60  # some outside the range
    points[:, 2] = points[:, 2] * 8 - 4
    points[:5000, :3] = points[:5000, :3] * 0.05  # a dense cluster, as near a LiDAR
    reference = Voxelization(voxel_size, [-50, -50, -3, 50, 50, 3], max_points, max_voxels)
    sorted_layer = SortedVoxelization.like(reference)
    for training in (True, False):
        reference.train(training)
        sorted_layer.train(training)
        expected, got = reference(points), sorted_layer(points)
        for a, b in zip(expected, got):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert expected[0].size(0) > 0
    empty = sorted_layer(points[:0])
    assert [tuple(t.shape) for t in empty] == [(0, max_points, 5), (0, 3), (0,)]


@pytest.mark.openmmlab
@pytest.mark.usefixtures("openmmlab_stack")
def test_voxelizer_sorted_swaps_the_preprocessors_layer_and_keeps_its_output():
    import torch
    from mmdet3d.structures import Det3DDataSample

    from drivebench.openmmlab.module import build_net
    from drivebench.openmmlab.voxelize import SortedVoxelization

    mmcv_net, sorted_net = build_net(CONFIG, "test"), build_net(CONFIG, "test", voxelizer="sorted")
    assert isinstance(sorted_net.model.data_preprocessor.voxel_layer, SortedVoxelization)
    generator = torch.Generator().manual_seed(1)
    points = [torch.rand(3000, 5, generator=generator) * 40 - 20 for _ in range(2)]
    batch = lambda: {"inputs": {"points": [p.clone() for p in points]},  # noqa: E731
                     "data_samples": [Det3DDataSample(), Det3DDataSample()]}
    a = mmcv_net.preprocess(batch(), True)["inputs"]["voxels"]
    b = sorted_net.preprocess(batch(), True)["inputs"]["voxels"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ConfigError, match="voxelizer='fast' is not valid; choose one of: mmcv, sorted"):
        build_net(CONFIG, "test", voxelizer="fast")


@pytest.mark.openmmlab
@pytest.mark.usefixtures("openmmlab_stack")
def test_preprocessor_casts_to_the_device_the_module_is_on():
    """Lightning moves the module with nn.Module.to, which never reaches mmengine's own device record;
    on a GPU the batch was voxelised on the host while the weights were on the device (H200, part 11)."""
    import torch
    from mmdet3d.structures import Det3DDataSample
    from torch import nn

    from drivebench.openmmlab.module import build_net

    net = build_net(CONFIG, "test")
    net.model.data_preprocessor._device = torch.device("meta")  # a stale record
    nn.ModuleDict({"net": net}).to(torch.device("cpu"))  # a parent's move, as Lightning's: never net.to
    batch = {"inputs": {"points": [torch.rand(200, 5) * 20]}, "data_samples": [Det3DDataSample()]}
    out = net.preprocess(batch, True)
    assert out["inputs"]["voxels"]["voxels"].device.type == "cpu"
    assert net.model.data_preprocessor.device == torch.device("cpu")


@pytest.mark.openmmlab
@pytest.mark.usefixtures("openmmlab_stack")
def test_cli_errors_are_one_line(drivebench_cache: Path, tmp_path: Path, in_process_cli, capsys):
    """The first through a real ``python -m drivebench`` (exit code, last line); the others through the
    command's entry point in this process, where mmdet3d is already imported (a subprocess each cost
    seconds of start-up for one line)."""
    proc = run_cli(["model=mmdet3d", "model.config=pointpilars_nus", f"hydra.run.dir={tmp_path / 'a'}"],
                   drivebench_cache)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("drivebench: error: model.config='pointpilars_nus' is not an mmdet3d config")
    assert "close matches: pointpillars" in line

    from drivebench.__main__ import main

    in_process_cli(drivebench_cache, tmp_path)

    def refused(args: list[str]) -> tuple[int, str]:
        """(exit code, stderr) of the drivebench command ``args``, run in this process."""
        with pytest.raises(SystemExit) as stop:
            main(args)
        return stop.value.code, capsys.readouterr().err

    kitti = "model.config=pointpillars_hv_secfpn_8xb6-160e_kitti-3d-car"
    code, err = refused(["model=mmdet3d", "model.size=test", kitti, f"hydra.run.dir={tmp_path / 'b'}"])
    line = err.strip().splitlines()[-1]
    assert code == 2 and "KittiDataset" in line and "data.dataset=config" in line, err[-2000:]
    code, err = refused(["model=mmdet3d", "model.size=test", "model.config=second_hv_secfpn_8xb6-80e_kitti-3d-car",
                         f"hydra.run.dir={tmp_path / 'c'}"])
    line = err.strip().splitlines()[-1]
    assert code == 2 and "SparseEncoder" in line and "model.size=config" in line, err[-2000:]
    code, err = refused([*TEST_SIZE, "bench=mmengine", "dist=ddp", f"hydra.run.dir={tmp_path / 'd'}"])
    assert code == 2 and "dist=single" in err, err[-2000:]


# ---- training under drivebench and under mmengine ------------------------------------------------------
@pytest.fixture(scope="module")
def runs(drivebench_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One drivebench run and one mmengine run of the same test-size config, data and batch size."""
    root = tmp_path_factory.mktemp("openmmlab-runs")
    common = [*TEST_SIZE, "accel=none", "bench.warmup_steps=2", "bench.steps=30"]
    for name, extra in (("drivebench", ["bench.val_batches=2", "bench.ceiling_steps=3", "bench.ceiling_warmup_steps=1"]),
                        ("mmengine", ["bench=mmengine"])):
        proc = run_cli([*common, *extra, f"hydra.run.dir={root / name}"], drivebench_cache)
        assert proc.returncode == 0, f"{name}: {proc.stderr[-4000:]}"
        assert "drivebench run summary" in proc.stdout
    return root


@pytest.mark.openmmlab
@pytest.mark.usefixtures("openmmlab_stack")
def test_test_size_pointpillars_trains_under_drivebench(runs: Path):
    s = json.loads((runs / "drivebench" / "summary.json").read_text())
    assert s["run"]["status"] == "completed" and s["run"]["model"] == "mmdet3d" and s["run"]["bench"] == "train"
    assert s["data"]["name"] == "mmdet3d" and s["data"]["dataset_type"] == "NuScenesDataset"
    assert s["data"]["nuscenes"]["embedded"] is True and s["data"]["train_samples"] == 10
    train = s["train"]
    assert train["steps_measured"] == 30 and train["samples_per_s"] > 0
    assert train["gpu_preprocess_s"]["median"] > 0  # the data_preprocessor (voxelisation) is timed
    assert s["loss"]["final"] < 0.9 * s["loss"]["first"] and s["loss"]["nonfinite_steps"] == 0, s["loss"]
    assert s["ceiling"]["steps_measured"] == 3 and s["efficiency"] > 0
    assert s["val"]["loss"] > 0 and "loss_cls" in s["val"]
    assert 1e4 < s["settings"]["parameters"] < 5e5  # the test size
    assert (runs / "drivebench" / "checkpoints").is_dir() and any((runs / "drivebench" / "checkpoints").iterdir())


@pytest.mark.openmmlab
@pytest.mark.usefixtures("openmmlab_stack")
def test_bench_mmengine_runs_the_same_config_with_mmengines_runner(runs: Path):
    s = json.loads((runs / "mmengine" / "summary.json").read_text())
    d = json.loads((runs / "drivebench" / "summary.json").read_text())
    assert s["run"]["bench"] == "mmengine" and s["run"]["runner"] == "mmengine" and s["run"]["status"] == "completed"
    train = s["train"]
    assert train["steps_measured"] == 30 and train["warmup_steps"] == 2 and train["samples_per_s"] > 0
    assert train["gpu_preprocess_s"]["median"] > 0 and train["data_wait_s"]["median"] > 0
    mm = s["settings"]["mmengine"]
    assert mm["iterations"] == 32 and mm["train_dataloader"]["num_workers"] == 0
    assert mm["train_dataloader"]["batch_size"] == d["settings"]["batch_size"] == 4
    assert mm["optim_wrapper"] == "OptimWrapper"
    assert s["loss"]["final"] < 0.9 * s["loss"]["first"], s["loss"]
    # the same model, initialised by the same seed: the first losses agree closely
    assert s["loss"]["first"] == pytest.approx(d["loss"]["first"], rel=0.25)
    assert list((runs / "mmengine" / "mmengine").rglob("*.log")), "mmengine's own log"


@pytest.mark.openmmlab
@pytest.mark.usefixtures("openmmlab_stack")
def test_report_puts_both_runners_side_by_side(runs: Path):
    from drivebench.report.analysis import analyse
    from drivebench.report.loading import load_runs

    table = analyse(load_runs([runs]).runs, load_runs([runs]).scalars, [])
    assert sorted(table["runner"]) == ["drivebench", "mmengine"]
    assert sorted(table["setting_key"]) == ["mmengine none", "none"]
    assert table["bench"].nunique() == 1  # one comparison group
    mm = table[table["runner"] == "mmengine"].iloc[0]
    db = table[table["runner"] == "drivebench"].iloc[0]
    assert mm["speedup"] == pytest.approx(mm["throughput_median"] / db["throughput_median"])

    from drivebench.openmmlab.compare import main as compare_main

    assert compare_main([str(runs)]) == 0
    result = json.loads((runs / "compare.json").read_text())
    (row,) = result["rows"]
    assert row["accel"] == "none" and row["mmengine"]["runs"] == row["drivebench"]["runs"] == 1
    assert row["drivebench_over_mmengine"] == pytest.approx(db["throughput_median"] / mm["throughput_median"])
    assert "drivebench / mmengine" in (runs / "compare.md").read_text()


@pytest.mark.openmmlab
@pytest.mark.usefixtures("openmmlab_stack")
def test_two_rank_ddp_on_cpu(drivebench_cache: Path, tmp_path: Path):
    """dist=ddp (gloo): drivebench's samplers split the mmdet3d dataset; naiveSyncBN all-reduces."""
    proc = run_cli([*TEST_SIZE, "accel=none", "dist=ddp", "dist.devices=2", "bench.warmup_steps=1", "bench.steps=4",
                    "bench.val_batches=0", "bench.ceiling=false", "ckpt=none", f"hydra.run.dir={tmp_path}"],
                   drivebench_cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["ranks"]["world_size"] == 2 and len(s["ranks"]["per_rank"]) == 2
    assert s["settings"]["global_batch_size"] == 8 and s["train"]["steps_measured"] == 4


# ---- the doctor -------------------------------------------------------------------------------------------
@pytest.mark.openmmlab
@pytest.mark.usefixtures("openmmlab_stack")
def test_doctor_lists_the_compiled_ops_and_the_torch_they_were_built_for():
    import torch

    from drivebench.doctor import extensions
    from drivebench.doctor.context import build_context
    from drivebench.doctor.result import Status

    result = extensions.mmcv_check(build_context([], skip_slow=True))
    assert result.status is Status.PASS, result.saw
    data = result.data
    assert data["ops"] is True and data["op_functions"] > 100
    assert {"nms", "hard_voxelize", "iou3d_nms3d"} <= set(data["op_names"]), data["op_names"]
    assert data["cpu_ops_run"] == ["nms", "voxelization"]
    assert data["built_for"] == f"torch {torch.__version__} (cpu ops)", data["built_for"]
    assert "compiled ops" in result.saw and torch.__version__ in result.saw


@pytest.mark.openmmlab
@pytest.mark.usefixtures("openmmlab_stack")
def test_voxel_bench_times_both_and_checks_they_agree(capsys: pytest.CaptureFixture[str]):
    from drivebench.openmmlab.voxel_bench import main

    assert main(["--points", "3000", "--repeats", "3", "--warmup", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "same voxels: True" in out and "mmcv / sorted (medians)" in out
    assert out.count(" ms [") == 2
