"""Activation checkpointing of the image backbones' residual blocks (mmcv's ``with_cp``).

Upstream SparseDrive and GaussianFormer train their ResNets with ``with_cp=True``: each residual
block keeps only its input for backward and runs its forward again when the gradient reaches it.
Here the same, with ``torch.utils.checkpoint`` (non-reentrant), and with mmcv's condition: a block
whose input carries no gradient (the first block after frozen stages) is not checkpointed, since it
keeps nothing worth dropping.

Checkpointing changes memory and time, not arithmetic: the recomputed forward is the same forward.
One side effect is removed on purpose: a training-mode BatchNorm updates its running statistics
every time its forward runs, so mmcv's recomputation updates them twice per step; here the
recomputation restores them (eager; under ``torch.compile`` the compiled graph recomputes values
only and updates them once either way).
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Iterator, Sequence

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint


@contextlib.contextmanager
def _keep_norm_statistics(module: nn.Module) -> Iterator[None]:
    norms = [m for m in module.modules() if isinstance(m, _BatchNorm) and m.training and m.track_running_stats]
    saved = [[b.clone() for b in (m.running_mean, m.running_var, m.num_batches_tracked)] for m in norms]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, values in zip(norms, saved):
                for buffer, value in zip((m.running_mean, m.running_var, m.num_batches_tracked), values):
                    buffer.copy_(value)


def _contexts(block: nn.Module) -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    return contextlib.nullcontext(), _keep_norm_statistics(block)


def run_blocks(blocks: Sequence[nn.Module], x: torch.Tensor, enabled: bool) -> torch.Tensor:
    """Run residual blocks in order; with ``enabled``, checkpoint each one whose input needs a gradient."""
    for block in blocks:
        if enabled and torch.is_grad_enabled() and x.requires_grad:
            if torch.compiler.is_compiling():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = checkpoint(block, x, use_reentrant=False, context_fn=partial(_contexts, block))
        else:
            x = block(x)
    return x


def checkpointable_backbones(net: nn.Module) -> list[nn.Module]:
    """Modules of ``net`` with an ``activation_checkpointing`` switch (classes that set
    ``supports_activation_checkpointing = True``: the ResNet backbones)."""
    return [m for m in net.modules() if getattr(type(m), "supports_activation_checkpointing", False)]


def set_activation_checkpointing(net: nn.Module, enabled: bool) -> int:
    """Switch checkpointing in every backbone of ``net``; returns how many backbones were switched."""
    backbones = checkpointable_backbones(net)
    for backbone in backbones:
        backbone.activation_checkpointing = enabled
    return len(backbones)


def saved_activation_bytes(backbone: nn.Module, image_shape: Sequence[int]) -> int:
    """Bytes of activations checkpointing would not keep, for one training forward of ``image_shape``.

    Measured, not modelled: the backbone runs in training mode on the meta device (no memory, no
    arithmetic), every tensor autograd saves inside a residual block is recorded once per storage,
    and the blocks' inputs and outputs (which checkpointing keeps) and weights are left out. Blocks whose
    input needs no gradient are skipped, as ``run_blocks`` does. Float32 sizes: under bf16 autocast
    the real figure is lower.
    """
    params = {k: torch.empty_like(v, device="meta").requires_grad_(v.requires_grad)
              for k, v in backbone.named_parameters()}
    buffers = {k: torch.empty_like(v, device="meta") for k, v in backbone.named_buffers()}
    keep = {t.untyped_storage()._cdata for t in (*params.values(), *buffers.values())}
    blocks = [block for stage in getattr(backbone, "stages") for block in stage]
    saved: dict[int, int] = {}
    active = [False]
    alive: list[torch.Tensor] = []  # storages are told apart by address: keep them alive so none is reused

    def pack(t: torch.Tensor) -> torch.Tensor:
        if active[0]:
            storage = t.untyped_storage()
            saved[storage._cdata] = storage.nbytes()
        return t

    def before(module: nn.Module, args: tuple) -> None:
        active[0] = bool(args[0].requires_grad)
        keep.add(args[0].untyped_storage()._cdata)
        alive.append(args[0])

    def after(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        active[0] = False
        keep.add(output.untyped_storage()._cdata)  # the next block's input: kept either way
        alive.append(output)

    handles = [h for b in blocks for h in (b.register_forward_pre_hook(before), b.register_forward_hook(after))]
    was_training, was_enabled = backbone.training, backbone.activation_checkpointing
    try:
        backbone.train()
        backbone.activation_checkpointing = False
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.enable_grad():
            torch.func.functional_call(backbone, {**params, **buffers},
                                       (torch.empty(*image_shape, device="meta"),))
    finally:
        for h in handles:
            h.remove()
        backbone.train(was_training)
        backbone.activation_checkpointing = was_enabled
    return sum(n for k, n in saved.items() if k not in keep)
