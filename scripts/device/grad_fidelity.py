"""How far `max`'s arithmetic moves QCNet's gradients from fp32's, part by part, on the same weights and batches.

QCNet's `max` runs trail `none` at equal steps (experiments/results/cpu2core-2026-12-06-qcnet-lag-by-variant): their
training losses too, so the optimisation itself is slower. A convergence run per variant needs several seeds to see a
0.2-m lag through the run-to-run spread; this compares the gradient each variant computes with an fp32 reference on
identical weights and batches (dropout off, so the only difference is the arithmetic), which is deterministic.

    python scripts/device/grad_fidelity.py cuda [EPOCHS] [BATCHES] [BUDGET_S]   # bench set, after EPOCHS at none
    python scripts/device/grad_fidelity.py cpu                                  # test size, random scenes

Variants: fp32 again (the reference's own run-to-run noise: atomics), TF32, bf16 autocast, bf16 autocast on padded
batches (what CUDA graphs train on), bf16 with the trajectory GRU under autocast as before 62f3910 (cuDNN's float16
on CUDA), bf16 with the output heads the other way than the net's model.net.output_heads_fp32 (on
since 2026-12-06: so in bf16, as before), then, while 120 s of BUDGET_S (counted from the start) are left, the compiled layers (Inductor) in fp32
and in bf16. Per variant one JSON line: the relative error ||g - g_ref|| / ||g_ref|| of each part's gradient over all
batches, the cosine of the whole gradient, and the losses' mean relative difference.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch
from lightning.pytorch.utilities import move_data_to_device
from torch import nn

from drivebench.accel.compile import apply_compile
from drivebench.models.qcnet import QCNetLoss, make_transform
from drivebench.models.qcnet.layers import TrajectoryGRU

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cuda"
EPOCHS = int(sys.argv[2]) if len(sys.argv) > 2 else 1
BATCHES = int(sys.argv[3]) if len(sys.argv) > 3 else 8
BUDGET_S = float(sys.argv[4]) if len(sys.argv) > 4 else 600.0
STARTED = time.time()


def part_of(name: str) -> str:
    """The gradient's part: the first two levels of the parameter's name (``decoder.to_loc_refine_pos``)."""
    return ".".join(name.split(".")[:2])


def gru_as_before_62f3910(self: TrajectoryGRU, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """``TrajectoryGRU.forward`` before 62f3910: under autocast, which on CUDA runs cuDNN's GRU in float16
    (PyTorch's autocast wrapper of cuDNN RNNs casts to half whatever the autocast dtype), unscaled under bf16."""
    if torch.compiler.is_compiling():
        return self._unrolled(x, h0)
    weights = (self.weight_ih_l0, self.weight_hh_l0, self.bias_ih_l0, self.bias_hh_l0)
    out = torch.gru(x.to(h0.dtype), h0.unsqueeze(0).contiguous(), weights, True, 1, 0.0, self.training, False, False)
    return out[1].squeeze(0)


def trained_net_and_batches() -> tuple[nn.Module, list[dict[str, Any]], Callable[[dict[str, Any]], dict[str, Any]]]:
    """On a GPU: the bench set's net after EPOCHS of accel=none, its first BATCHES training batches and the module's
    padder; on the CPU: the test size at init on random scenes."""
    if DEVICE == "cpu":
        from drivebench.models import create_model
        from drivebench.models.qcnet.random_scenario import random_batch
        from drivebench.models.qcnet.static_shapes import ShapeBuckets, StaticShapePadder

        torch.manual_seed(0)
        net = create_model("qcnet", "test", compile_scope="layers")
        transform = make_transform("test")
        batches = [random_batch(transform, num_scenes=3, seed=10 * i, num_agents=6, num_polygons=16, extent=60.0)
                   for i in range(BATCHES)]
        g = net.graph_settings
        return net, batches, StaticShapePadder(g.num_historical_steps, g.num_modes, ShapeBuckets())
    import lightning.pytorch as pl

    from drivebench.app import build_run, quiet_third_party_noise
    from drivebench.compose import compose

    quiet_third_party_noise()
    cfg = compose(["+experiment=convergence", "model=qcnet", "accel=none", "seed=2024", "ckpt=none"])
    run = build_run(cfg, Path("/tmp/grad-fidelity"), progress=False)
    t0 = time.time()
    if EPOCHS:
        pl.Trainer(**run.trainer_kwargs(), logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   max_epochs=EPOCHS, limit_val_batches=0).fit(run.module, datamodule=run.datamodule)
    else:
        run.datamodule.setup("fit")
    print(json.dumps({"trained_epochs": EPOCHS, "train_s": round(time.time() - t0, 1)}), flush=True)
    batches = []
    for batch in run.datamodule.train_dataloader():
        batches.append(batch)
        if len(batches) == BATCHES:
            break
    return run.module.net, batches, run.module.static_batch


Result = tuple[dict[str, torch.Tensor], list[float], dict[str, list[torch.Tensor]]]


def gradients(net: nn.Module, batches: list[dict[str, Any]], bf16: bool, tf32: bool) -> Result:
    """Every parameter's gradient per batch (stacked), the losses, and the real agents' outputs per batch."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    criterion = QCNetLoss()
    grads: dict[str, list[torch.Tensor]] = {}
    losses = []
    outputs: dict[str, list[torch.Tensor]] = {}
    for batch in batches:
        net.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE, dtype=torch.bfloat16) if bf16 else nullcontext():
            out = net(batch)
            loss = criterion(out, batch)["loss"]
        loss.backward()
        losses.append(float(loss.detach()))
        for key, value in out.items():
            outputs.setdefault(key, []).append(value.detach().float())
        for name, p in net.named_parameters():
            if p.grad is not None:
                grads.setdefault(name, []).append(p.grad.detach().float().clone())
    return {k: torch.stack(v) for k, v in grads.items()}, losses, outputs


def output_error(ref: dict[str, list[torch.Tensor]], got: dict[str, list[torch.Tensor]]) -> dict[str, float]:
    """||out - out_ref|| / ||out_ref|| of each output over the batches, real rows only (a padded batch's
    outputs start with the real agents' rows)."""
    errors = {}
    for key, refs in ref.items():
        num = den = 0.0
        for a, b in zip(refs, got[key]):
            b = b[: a.shape[0]]
            num += float((b - a).pow(2).sum())
            den += float(a.pow(2).sum())
        errors[key] = round((num / den) ** 0.5, 6) if den else None
    return errors


def compare(label: str, ref: Result, got: Result, seconds: float) -> None:
    (g_ref, l_ref, o_ref), (g, l, o) = ref, got
    num: dict[str, float] = {}
    den: dict[str, float] = {}
    for name, value in g_ref.items():
        part = part_of(name)
        num[part] = num.get(part, 0.0) + float((g[name] - value).pow(2).sum())
        den[part] = den.get(part, 0.0) + float(value.pow(2).sum())
    flat_ref = torch.cat([v.flatten(1) for v in g_ref.values()], 1)
    flat = torch.cat([g[k].flatten(1) for k in g_ref], 1)
    cosine = torch.nn.functional.cosine_similarity(flat, flat_ref, dim=1)
    print(json.dumps({
        "variant": label, "seconds": round(seconds, 1),
        "rel_err_all": round((sum(num.values()) / sum(den.values())) ** 0.5, 5),
        "cosine_per_batch_min": round(float(cosine.min()), 6),
        "loss_rel_diff_mean": round(sum(abs(a - b) / abs(b) for a, b in zip(l, l_ref)) / len(l), 6),
        "loss_signed_diff_mean": round(sum(a - b for a, b in zip(l, l_ref)) / len(l), 6),  # a bias, or noise
        "outputs_rel_err": output_error(o_ref, o),
        "worst_parts": dict(sorted(((p, round((num[p] / den[p]) ** 0.5, 5)) for p in num if den[p] > 0),
                                   key=lambda kv: -kv[1])[:8]),
    }), flush=True)


def main() -> None:
    net, batches, pad = trained_net_and_batches()
    net = net.to(DEVICE).train()
    for module in net.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0  # the arithmetic alone: dropout masks would differ between any two passes
    batches = [move_data_to_device(b, DEVICE) for b in batches]
    padded = [pad(b) for b in batches]
    t = time.time()
    ref = gradients(net, batches, bf16=False, tf32=False)
    print(json.dumps({"reference": "fp32 eager", "seconds": round(time.time() - t, 1), "batches": len(batches),
                      "loss_mean": sum(ref[1]) / len(ref[1])}), flush=True)
    variants = [("fp32 again", batches, False, False), ("tf32", batches, False, True),
                ("bf16", batches, True, False), ("bf16 padded", padded, True, False),
                ("bf16+tf32 padded", padded, True, True)]
    for label, data, bf16, tf32 in variants:
        t = time.time()
        compare(label, ref, gradients(net, data, bf16, tf32), time.time() - t)
    fixed_gru, TrajectoryGRU.forward = TrajectoryGRU.forward, gru_as_before_62f3910
    t = time.time()
    compare("bf16, GRU under autocast (before the fix)", ref, gradients(net, batches, True, False), time.time() - t)
    TrajectoryGRU.forward = fixed_gru
    heads_fp32 = net.decoder.output_heads_fp32  # model.net.output_heads_fp32 (on since 2026-12-06): the other way
    net.decoder.output_heads_fp32 = not heads_fp32
    label = "output heads fp32" if not heads_fp32 else "output heads bf16 (as before 2026-12-06)"
    t = time.time()
    compare(f"bf16, {label}", ref, gradients(net, batches, True, False), time.time() - t)
    t = time.time()
    compare(f"bf16 padded, {label}", ref, gradients(net, padded, True, False), time.time() - t)
    net.decoder.output_heads_fp32 = heads_fp32
    # the harness's own compile step (every attention layer and Fourier embedding, the raised recompile limit)
    apply_compile(net, SimpleNamespace(compile=True, compile_mode="default", compile_dynamic=None))
    for label, data, bf16 in (("compiled fp32 padded", padded, False), ("compiled bf16 padded", padded, True)):
        if time.time() - STARTED > BUDGET_S - 120:
            print(json.dumps({"skipped": label, "reason": "compile budget"}), flush=True)
            continue
        t = time.time()
        compare(label, ref, gradients(net, data, bf16, tf32=False), time.time() - t)
        stats = torch._dynamo.utils.counters
        print(json.dumps({"dynamo_graphs": stats["stats"]["unique_graphs"], "frames": dict(stats["frames"]),
                          "fallbacks": {k: v for k, v in stats.items() if k in ("unimplemented", "graph_break")}},
                         default=str)[:600], flush=True)


if __name__ == "__main__":
    main()
