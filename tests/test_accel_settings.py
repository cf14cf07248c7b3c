"""accel presets resolve against the machine; bad knob values stop with one clear message."""

from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from drivebench.accel.settings import AccelSettings
from drivebench.errors import ConfigError
from drivebench.perf.machine import GPUInfo, MachineInfo

CONF = Path(__file__).resolve().parents[1] / "drivebench" / "conf"
PRESETS = sorted(p.stem for p in (CONF / "accel").glob("*.yaml"))


def machine(gpus: int, cores: int) -> MachineInfo:
    return MachineInfo(hostname="h", cpu_model="x", cpu_cores=cores, ram_gb=64, shm_gb=32, shm_free_gb=30,
                       accelerator="cuda" if gpus else "cpu",
                       gpus=[GPUInfo(i, "NVIDIA H200", 139.0, "9.0") for i in range(gpus)], bf16_supported=bool(gpus))


def preset(name: str, *overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"accel={name}", *overrides])
    return OmegaConf.to_container(cfg.accel, resolve=True)


def test_presets_are_the_documented_four_at_least():
    assert {"none", "cpu", "torch", "max"} <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_resolves_on_cpu_and_gpu(name):
    for m in (machine(0, 2), machine(1, 16), machine(2, 32)):
        s = AccelSettings.resolve(preset(name), m)
        assert s.num_workers >= 0 and s.preprocess_workers >= 0


def test_none_is_the_naive_baseline():
    s = AccelSettings.resolve(preset("none"), machine(1, 16))
    assert (s.num_workers, s.pin_memory, s.compile, s.precision, s.shm_cache) == (0, False, False, "32-true", False)
    assert s.numerics_changes() == []


def test_max_on_an_h200_uses_every_core_bf16_and_compile():
    s = AccelSettings.resolve(preset("max"), machine(1, 16))
    # a loader worker per core but the one the thread budget keeps for the training process
    assert s.num_workers == 15 and s.threads == 1 and s.pin_memory and s.persistent_workers and s.compile
    assert s.precision == "bf16-mixed" and s.tf32 and s.shm_cache and s.preprocess_workers == 16
    assert "precision=bf16-mixed" in s.numerics_changes()


def test_max_on_two_gpus_splits_cores_per_device():
    assert AccelSettings.resolve(preset("max"), machine(2, 32)).num_workers == 15
    assert AccelSettings.resolve(preset("max"), machine(2, 8)).num_workers == 3
    # without the thread budget (PyTorch's thread defaults) every core of the device gets a worker
    assert AccelSettings.resolve(preset("max", "accel.threads=default"), machine(2, 8)).num_workers == 4


def test_max_on_a_cpu_machine_stays_fp32_uncompiled():
    s = AccelSettings.resolve(preset("max"), machine(0, 2))
    assert s.precision == "32-true" and not s.compile and not s.pin_memory
    assert s.num_workers == 1  # half the cores load, the other half trains


def test_single_knob_override_wins():
    s = AccelSettings.resolve(preset("none", "accel.num_workers=4"), machine(1, 16))
    assert s.num_workers == 4 and s.persistent_workers is False


@pytest.mark.parametrize(
    "override, message",
    [
        ("accel.num_workers=-1", "accel.num_workers=-1"),
        ("accel.precision=fp8", "accel.precision='fp8'"),
        ("accel.compile_mode=fast", "accel.compile_mode='fast'"),
        ("accel.prefetch_factor=0", "accel.prefetch_factor=0"),
        ("accel.compile_cache=''", "accel.compile_cache=''"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        AccelSettings.resolve(preset("max", override), machine(1, 16))


@pytest.mark.parametrize("override", ["+accel.num_wrokers=2", "accel.num_wrokers=2"])
def test_an_unknown_knob_is_refused_while_composing(override):
    # the schema (drivebench.schemas.AccelConfig) refuses it, appended with + or not, before resolve runs
    from drivebench.compose import compose

    with pytest.raises(ConfigError, match=r"accel.num_wrokers=2 is not a key of accel; valid keys: .*num_workers"):
        compose(["accel=max", override])


def test_half_precision_on_cpu_is_refused():
    with pytest.raises(ConfigError, match="needs a GPU"):
        AccelSettings.resolve(preset("none", "accel.precision=16-mixed"), machine(0, 2))


def test_every_knob_is_documented_in_the_base_preset():
    text = (CONF / "accel" / "none.yaml").read_text()
    knobs = yaml.safe_load(text)
    for line in text.splitlines():
        key = line.split(":")[0]
        if key in knobs and key != "name":
            assert "#" in line, f"accel knob {key} has no comment in drivebench/conf/accel/none.yaml"


def _gpu_machine(memory_gb: float) -> MachineInfo:
    return MachineInfo(hostname="h", cpu_model="x", cpu_cores=16, ram_gb=64, shm_gb=32, shm_free_gb=30,
                       accelerator="cuda", gpus=[GPUInfo(0, "GPU", memory_gb, "9.0")], bf16_supported=True)


def test_activation_checkpointing_keep_off_auto():
    from drivebench.models import create_model

    assert AccelSettings.resolve(preset("none"), machine(1, 16)).activation_checkpointing == "keep"
    assert AccelSettings.resolve(preset("max"), machine(1, 16)).activation_checkpointing == "auto"
    net = create_model("sparsedrive", "test")  # upstream: with_cp=True
    backbone = net.encoder.backbone
    keep = AccelSettings.resolve(preset("none"), _gpu_machine(139.0)).apply_activation_checkpointing(net, _gpu_machine(139.0), 6)
    assert keep["enabled"] and keep["model_default"] and backbone.activation_checkpointing
    off = AccelSettings.resolve(preset("none", "accel.activation_checkpointing=off"), machine(0, 2))
    assert not off.apply_activation_checkpointing(net, machine(0, 2), 6)["enabled"]
    assert not backbone.activation_checkpointing
    backbone.activation_checkpointing = True
    auto = AccelSettings.resolve(preset("max"), _gpu_machine(139.0))
    big = auto.apply_activation_checkpointing(net, _gpu_machine(139.0), 6)
    assert not big["enabled"] and 0 < big["saved_gib_estimate"] <= big["budget_gib"] and "auto: off" in big["reason"]
    backbone.activation_checkpointing = True
    tiny_gpu = _gpu_machine(big["saved_gib_estimate"] * 2)  # 25% of it is less than what checkpointing saves
    small = auto.apply_activation_checkpointing(net, tiny_gpu, 6)
    assert small["enabled"] and backbone.activation_checkpointing and "auto: kept" in small["reason"]
    on_cpu = auto.apply_activation_checkpointing(net, machine(0, 2), 6)
    assert on_cpu["enabled"] and "not a CUDA device" in on_cpu["reason"]
    maptr = create_model("maptr", "test")  # upstream trains without: auto has nothing to turn off
    assert auto.apply_activation_checkpointing(maptr, _gpu_machine(139.0), 4) == {
        "knob": "auto", "model_default": False, "enabled": False,
        "reason": "model.net.activation_checkpointing (upstream's setting)"}


def test_activation_checkpointing_bad_value_names_the_choices():
    with pytest.raises(ConfigError, match="accel.activation_checkpointing='sometimes' is not valid; choose one of: keep, off, auto"):
        AccelSettings.resolve(preset("none", "accel.activation_checkpointing=sometimes"), machine(0, 2))


def test_fused_optimizer_gives_way_to_clipping_under_mixed_precision():
    """Lightning's mixed-precision plugin refuses to clip with a fused Adam (it unscales inside its step):
    auto turns the kernel off with the reason, an explicit true is refused in one line, and without
    clipping or under fp32 the kernel stays on (the H200 run of GaussianFormer max crashed at its first
    clipped step before this rule)."""
    auto = AccelSettings.resolve(preset("max"), machine(1, 16))
    assert auto.fused_optimizer and auto.precision == "bf16-mixed"
    status = auto.settle_fused_optimizer("auto", 35.0)
    assert status.startswith("off: gradient clipping") and not auto.fused_optimizer
    assert not any(c.startswith("fused_optimizer") for c in auto.numerics_changes())

    forced = AccelSettings.resolve(preset("max", "accel.fused_optimizer=true"), machine(1, 16))
    with pytest.raises(ConfigError, match=r"accel.fused_optimizer=true .*trainer.gradient_clip_val=35"):
        forced.settle_fused_optimizer(True, 35)
    assert forced.settle_fused_optimizer(True, None) == "on" and forced.fused_optimizer

    fp32 = AccelSettings.resolve(preset("max", "accel.precision=32-true"), machine(1, 16))
    assert fp32.settle_fused_optimizer("auto", 35.0) == "on" and fp32.fused_optimizer


def test_shape_profile_auto_stays_off_for_models_whose_compiled_shapes_do_not_depend_on_the_data():
    """``compile_shape_profile=auto`` keeps Dynamo's shape profile for QCNet (bucketed graph sizes) and SparseDrive
    with denoising queries, and turns it off for models whose compiled shapes are the same every step, where it
    only cost the second run its cache (b61); an explicit true keeps it; a run that compiles nothing keeps none."""
    from drivebench.models.registry import create_model

    def settled(net: torch.nn.Module, *overrides: str, requested: object = "auto") -> tuple[str, bool]:
        accel = AccelSettings.resolve(preset("max", *overrides), machine(1, 16))
        assert accel.compile and accel.compile_shape_profile  # auto on a GPU
        status = accel.settle_shape_profile(requested, net)
        return status, accel.compile_shape_profile

    qcnet = create_model("qcnet", size="test")
    sparsedrive = create_model("sparsedrive", size="test")
    denoising = create_model("sparsedrive", size="test", num_dn_groups=2)
    maptr = create_model("maptr", size="test")
    gaussianformer = create_model("gaussianformer", size="test")
    assert settled(qcnet) == ("on", True) and settled(denoising) == ("on", True)
    for net in (sparsedrive, maptr, gaussianformer):
        status, kept = settled(net)
        assert status.startswith("off: the model's compiled shapes do not depend on the data") and not kept, net
    assert settled(sparsedrive, "accel.compile_shape_profile=true", requested=True) == ("on", True)
    eager = AccelSettings.resolve(preset("max", "accel.compile=false"), machine(1, 16))
    assert eager.settle_shape_profile("auto", qcnet) == "off"


def test_lightning_still_refuses_to_clip_with_a_fused_optimizer_under_mixed_precision():
    """The rule above mirrors Lightning's: if this starts passing, the rule can go."""
    import torch
    from lightning.pytorch.plugins.precision import MixedPrecision

    param = torch.nn.Parameter(torch.ones(3))
    param.grad = torch.ones(3)
    fused = torch.optim.AdamW([param], fused=True)
    with pytest.raises(RuntimeError, match="fused"):
        MixedPrecision("bf16-mixed", "cpu").clip_gradients(fused, 35.0)


def test_numerics_lists_only_knobs_that_act_on_the_run():
    s = AccelSettings.resolve(preset("max", "accel.device_transform=decode"), machine(1, 16))
    assert {"compile", "device_transform=decode"} <= {c.split(" ")[0] for c in s.numerics_changes()}
    # QCNet: no compile units, no images
    left = {c.split(" ")[0] for c in s.numerics_changes(compiles=False, decodes_on_device=False)}
    assert "compile" not in left and "device_transform=decode" not in left and "precision=bf16-mixed" in left


def test_a_checkpointing_choice_made_on_the_run_steps_reaches_the_summary_record():
    """``accel=auto`` chose checkpointing off on the run's own steps: the run's settings and the summary's
    ``settings.activation_checkpointing`` say what trained from then on, not what the run was built with."""
    from types import SimpleNamespace

    from drivebench.bench.runners import _adopt_live_knobs

    accel = AccelSettings.resolve(preset("auto"), _gpu_machine(139.0))
    run = SimpleNamespace(accel=accel, fused_optimizer="off", activation_checkpointing={
        "knob": "keep", "model_default": True, "enabled": True, "reason": "model.net.activation_checkpointing"})
    _adopt_live_knobs(run, {"activation_checkpointing": "off", "cuda_graphs": "off"})
    assert run.accel.activation_checkpointing == "off"
    assert run.activation_checkpointing["enabled"] is False and run.activation_checkpointing["model_default"]
    assert "run's own steps" in run.activation_checkpointing["reason"]
    # a model without a checkpointable backbone: its knob stays what it was built with, and so does the record
    qcnet = {"knob": "keep", "model_default": None, "enabled": False, "reason": "the model has no checkpointable backbone"}
    run.activation_checkpointing = dict(qcnet)
    _adopt_live_knobs(run, {"activation_checkpointing": "keep", "cuda_graphs": "on"})
    assert run.activation_checkpointing == qcnet
