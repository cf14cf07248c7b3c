"""``accel=auto``'s compile decision, made on the run's own steps.

A cold compile takes minutes on a GPU (QCNet on an H200: 130-190 s): a trial budget that is a small
share of a bounded run cannot cover it, and a compile tried in the trial would be paid again by the
run. So the trial (``drivebench.accel.autotune``) leaves compile out, and the run starts compiled on
top of the trial's eager choice (with CUDA graphs where the model pads its batches to static shapes).
After its warm-up and ``steps`` measured steps, :class:`CompileJudge` compares their median with the
chosen eager row's trial median: compile stays unless eager is faster by more than the margin, as
the trial's compute knobs keep ``max``'s value inside the noise (its cost is paid by then, and ``max``
compiles); otherwise the compiled units go back to eager (``nn.Module.compile`` compiles in place,
and clearing its compiled call restores the module's own) and the CUDA graphs back to the eager
choice, for the rest of the run. What it decided goes into the summary's ``autotune`` block.

Until 2026-12-05 compile had to save the margin to stay: GaussianFormer on an H100 measured compile
3.5% faster over its 10 judging steps, undid it, and trained 5% slower than ``max`` compiled (b41).
"""

from __future__ import annotations

import logging
import statistics
from typing import Any

import lightning.pytorch as pl
from torch import nn

from drivebench.perf.callback import StepTimer

log = logging.getLogger("drivebench")


def keeps_compile(compiled_s: float, eager_s: float, margin: float) -> bool:
    """Whether compile stays: unless the eager choice's step is shorter than the compiled one by more than
    ``margin`` of it."""
    return eager_s * (1.0 + margin) >= compiled_s


class CompileJudge(pl.Callback):
    """Keep or undo ``compile`` (and the CUDA graphs it came with) after ``steps`` measured run steps.

    Args:
        timer: the run's step timer (its measured records: warm-up, where the compile happens, excluded).
        units: the compiled modules (``drivebench.accel.compile.compile_units`` of the net).
        eager_step_s: median step time of the trial's chosen eager row.
        margin: share of the step eager must save for compile to go (``accel.auto_margin``).
        steps: measured steps to judge on (``accel.auto_steps``).
        graphs_after_revert: whether the eager choice replays CUDA graphs (``False``: drop them).
        record: the summary's ``autotune`` block, updated in place with the decision.
    """

    def __init__(self, timer: StepTimer, units: dict[str, nn.Module], eager_step_s: float, margin: float,
                 steps: int, graphs_after_revert: bool, record: dict[str, Any]) -> None:
        self.timer = timer
        self.units = units
        self.eager_step_s = float(eager_step_s)
        self.margin = float(margin)
        self.steps = max(int(steps), 1)
        self.graphs_after_revert = graphs_after_revert
        self.record = record
        self.decided = False
        record["compile_in_run"] = {"eager_step_s": self.eager_step_s, "steps": self.steps, "judged": False,
                                    "kept": None, "compiled_step_s": None, "judged_at_step": None}

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self.decided:
            return
        measured = self.timer.times.measured()
        if len(measured) < self.steps:
            return
        self.decided = True
        compiled = statistics.median(r.step_s for r in measured[:self.steps])
        kept = keeps_compile(compiled, self.eager_step_s, self.margin)
        verdict = self.record["compile_in_run"]
        verdict.update(judged=True, kept=kept, compiled_step_s=compiled, judged_at_step=int(trainer.global_step))
        self._update_rows(kept, compiled, measured[:self.steps])
        if not kept:
            self.revert(pl_module)
        log.info("accel trial: compile %s at step %d: compiled median %.1f ms against %.1f ms eager (margin %.0f%%)",
                 "kept" if kept else "undone", trainer.global_step, compiled * 1e3, self.eager_step_s * 1e3,
                 self.margin * 100)
        print(f"accel trial: compile {'kept' if kept else 'undone (back to the eager choice)'} at step "
              f"{trainer.global_step}: compiled median {compiled * 1e3:.1f} ms against the eager choice's "
              f"{self.eager_step_s * 1e3:.1f} ms", flush=True)

    def revert(self, pl_module: pl.LightningModule) -> None:
        """Back to eager: every unit's own forward, and the CUDA graphs the eager choice had."""
        for unit in self.units.values():
            unit._compiled_call_impl = None  # what nn.Module.compile set; None calls the module's own forward
        graphed = getattr(pl_module, "graphed_loss", None)
        if graphed is not None:
            if self.graphs_after_revert:
                graphed.release()  # captured around compiled kernels: capture the eager forward anew
            else:
                pl_module.disable_cuda_graphs()

    def _update_rows(self, kept: bool, compiled: float, records: list[Any]) -> None:
        times = sorted(r.step_s for r in records)
        row = next((t for t in self.record.get("trials", []) if t.get("stage") == "compile"), None)
        if row is not None:
            row.update(step_s_median=compiled, step_s_p10=times[int(0.1 * (len(times) - 1))],
                       step_s_p90=times[int(round(0.9 * (len(times) - 1)))], steps_measured=len(records),
                       chosen=kept, reason=("kept" if kept else "undone") + f" on the run's steps: {compiled * 1e3:.1f} ms "
                       f"against the chosen eager row's {self.eager_step_s * 1e3:.1f} ms")
        if not kept:  # the run goes on with the trial's eager choice
            eager = dict(self.record.get("eager_choice") or {})
            self.record["chosen"] = eager
            base = self.record.get("base") or {}
            self.record["changed"] = {k: v for k, v in eager.items() if base.get(k) != v}
