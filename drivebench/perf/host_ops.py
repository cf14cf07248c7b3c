"""Which modules issue a step's host ops: one training step's (and a validation batch's) operators, by module.

A step the profiler calls launch-bound (the GPU idle while the main process sits at 100% of a core) costs
host time per operator: each one goes through Python, the dispatcher and a kernel launch. The profiler's
trace says how many ran, not which part of the model issued them, and without that the fix (a compile
unit around that part, or fewer, larger ops in it) has no address. This callback counts the operators one
training step dispatches (below autograd, as the kernels run: ``t`` + ``addmm`` for a linear layer), each
charged to the innermost module whose forward was running, and the backward pass and the optimizer step to
their own rows; then likewise the first validation batch after it (a validation of many small batches can
be host-bound where training is not). The counted batches run every compiled unit eagerly
(``torch.compiler.set_stance("force_eager")``: under the counting mode Dynamo would compile each unit again),
so the counts are the eager model's: what a compile unit around a part would take off the host is that
part's row.

Enable with ``+callbacks.host_ops._target_=drivebench.perf.host_ops.HostOpCounter`` (its arguments as
``+callbacks.host_ops.<name>=...``); the tables are logged and written to ``<run dir>/host_ops.json``
(``train`` and, where the fit validated after the counted step, ``validation``).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

log = logging.getLogger(__name__)

BACKWARD, OPTIMIZER, OUTSIDE = "(backward)", "(optimizer)", "(outside any module)"
TRAIN, VALIDATION = "train", "validation"
FILE_NAME = "host_ops.json"


class _OpTally(TorchDispatchMode):
    """Counts every dispatched operator under the label the counter's module stack gives it."""

    def __init__(self, label: Any) -> None:
        super().__init__()
        self.label = label
        self.by_label: Counter[str] = Counter()
        self.by_op: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.by_label[self.label()] += 1
        self.by_op[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


class HostOpCounter(pl.Callback):
    """Count the operators of training step ``step`` (0-based, past any warm-up) by module, and those of the
    first batch of the fit's first validation after it (forward, losses and metric updates under ``no_grad``).

    Args:
        step: the training step counted (a later step than the first: no lazy set-up in it).
        depth: module paths are cut to this many dotted parts (``det_head.layers.3``: depth 3).
        top: rows logged (the json keeps them all).
    """

    def __init__(self, step: int = 3, depth: int = 2, top: int = 25) -> None:
        if step < 0 or depth < 1 or top < 1:
            raise ValueError(f"host_ops: step >= 0, depth >= 1 and top >= 1, got {step}, {depth}, {top}")
        self.step, self.depth, self.top = step, depth, top
        self.result: dict[str, Any] = {}  # "train" and "validation", as each is counted
        self._modules: list[str] = []  # the paths of the forwards running, innermost last
        self._phase: str | None = None
        self._tally: _OpTally | None = None
        self._counting: str | None = None  # TRAIN or VALIDATION while a batch is counted
        self._held = ExitStack()  # over a counted batch: the module hooks, the force_eager stance, the tally

    def _label(self) -> str:
        if self._phase is not None:
            return self._phase
        return self._modules[-1] if self._modules else OUTSIDE

    def _watch(self, net: nn.Module) -> None:
        for name, module in net.named_modules():
            path = ".".join(name.split(".")[: self.depth]) or "(model)"

            def enter(_m: nn.Module, _args: Any, path: str = path) -> None:
                self._modules.append(path)

            def leave(_m: nn.Module, _args: Any, _out: Any) -> None:
                if self._modules:
                    self._modules.pop()

            self._held.callback(module.register_forward_pre_hook(enter).remove)
            self._held.callback(module.register_forward_hook(leave).remove)

    def _start(self, kind: str, pl_module: pl.LightningModule) -> None:
        self._watch(getattr(pl_module, "net", pl_module))
        self._held.enter_context(torch.compiler.set_stance("force_eager"))
        self._tally, self._counting = self._held.enter_context(_OpTally(self._label)), kind

    def _stop(self, trainer: pl.Trainer) -> None:
        tally, kind = self._tally, self._counting
        self._held.close()
        self._tally = self._counting = self._phase = None
        self._modules = []
        self.result[kind] = summarise(tally.by_label, tally.by_op, self.step if kind == TRAIN else trainer.global_step)
        if trainer.is_global_zero:
            out = Path(trainer.default_root_dir) / FILE_NAME
            out.write_text(json.dumps(self.result, indent=2) + "\n")
            what = f"training step {self.step}" if kind == TRAIN else "a validation batch"
            log.info("host ops of %s (%s):\n%s", what, out, render(self.result[kind], self.top))

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if trainer.global_step == self.step and self._tally is None and TRAIN not in self.result:
            self._start(TRAIN, pl_module)

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        self._phase = BACKWARD if self._tally is not None else None

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        self._phase = OPTIMIZER if self._tally is not None else None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._counting == TRAIN:
            self._stop(trainer)

    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        if (trainer.sanity_checking or trainer.global_step <= self.step or self._tally is not None
                or VALIDATION in self.result):
            return
        self._start(VALIDATION, pl_module)

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if self._counting == VALIDATION:
            self._stop(trainer)


def summarise(by_label: Counter[str], by_op: Counter[str], step: int) -> dict[str, Any]:
    """The counts as a json-able dict, largest first."""
    return {"step": step, "total": sum(by_label.values()),
            "by_module": dict(by_label.most_common()), "by_op": dict(by_op.most_common())}


def render(result: dict[str, Any], top: int) -> str:
    """A plain table: the largest modules and operators with their share of the step's ops."""
    total = max(result["total"], 1)
    lines = [f"{result['total']} ops at step {result['step']}"]
    for title, key in (("module", "by_module"), ("operator", "by_op")):
        lines.append(f"  by {title}:")
        lines += [f"    {count:>7}  {100 * count / total:5.1f}%  {name}"
                  for name, count in list(result[key].items())[:top]]
    return "\n".join(lines)
