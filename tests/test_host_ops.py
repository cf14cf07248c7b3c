"""HostOpCounter: one training step's operators charged to the module that issued them."""

from __future__ import annotations

import json

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from drivebench.perf.host_ops import BACKWARD, OPTIMIZER, OUTSIDE, HostOpCounter, render


class _Busy(nn.Linear):
    def __init__(self, loop: int) -> None:
        super().__init__(4, 4)
        self.loop = loop

    def forward(self, x):
        for _ in range(self.loop):
            x = x + 1
        return super().forward(x)


class _TwoParts(pl.LightningModule):
    """A small part (one linear) and a busy part (a Python loop of element-wise ops)."""

    def __init__(self, loop: int) -> None:
        super().__init__()
        self.net = nn.ModuleDict({"small": nn.Linear(4, 4), "busy": _Busy(loop)})

    def training_step(self, batch, batch_idx):
        x = self.net["small"](batch[0])
        y = self.net["busy"](x)
        return (y * 2).sum()  # the loss's ops run outside any module

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.training_step(batch, batch_idx))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("loop", [5, 40])
def test_counts_follow_the_module_that_issues_them(tmp_path, loop: int) -> None:
    torch.manual_seed(0)
    module = _TwoParts(loop)
    counter = HostOpCounter(step=2, depth=1)
    loader = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4)
    trainer = pl.Trainer(max_steps=8, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         callbacks=[counter], limit_val_batches=2, num_sanity_val_steps=1)
    trainer.fit(module, loader, loader)  # 4 batches an epoch: validations after steps 4 and 8
    written = json.loads((tmp_path / "host_ops.json").read_text())
    assert written == counter.result and set(written) == {"train", "validation"}
    result, validation = written["train"], written["validation"]
    assert result["step"] == 2 and validation["step"] == 4  # the sanity check's batch is not the one counted
    val_rows = validation["by_module"]
    assert val_rows["busy"] >= loop + 1 and val_rows["busy"] - val_rows["small"] >= loop - 2
    assert BACKWARD not in val_rows and OPTIMIZER not in val_rows
    rows = result["by_module"]
    assert rows["busy"] >= loop + 1 and rows["small"] < loop  # the loop's adds land on the module that ran them
    assert rows["busy"] - rows["small"] >= loop - 2
    for row in (BACKWARD, OPTIMIZER, OUTSIDE):
        assert rows[row] > 0
    assert sum(rows.values()) == result["total"] == sum(result["by_op"].values())
    assert result["by_op"]["add"] >= loop
    assert not module.net["busy"]._forward_pre_hooks  # the hooks are gone after the counted step
    assert f"{result['total']} ops at step 2" in render(result, top=3)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="depth"):
        HostOpCounter(depth=0)
