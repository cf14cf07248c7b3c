"""SparseDrive's two upstream recipes, picked by ``model.stage``: stage 1 (perception only, lr 4e-4,
8 x 8, 100 epochs) and stage 2 (the default, lr 3e-4, 8 x 6, 10 epochs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from drivebench.app import validate
from drivebench.errors import ConfigError

CONF = Path(__file__).resolve().parents[1] / "drivebench" / "conf"


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=["model=sparsedrive", "model.size=test", *overrides])


@pytest.mark.parametrize("stage, batch, lr, steps, epochs", [(1, 8, 4e-4, 43900, 100), (2, 6, 3e-4, 5860, 10)])
def test_stage_picks_upstreams_recipe(stage: int, batch: int, lr: float, steps: int, epochs: int) -> None:
    cfg = _compose(f"model.stage={stage}", "trainer=full", "data.size=bench")
    validate(cfg)
    assert (cfg.model.net.stage, cfg.model.batch_size, cfg.model.val_batch_size) == (stage, batch, batch)
    assert cfg.model.optimizer.lr == pytest.approx(lr) and cfg.model.optimizer.weight_decay == pytest.approx(1e-3)
    assert cfg.model.scheduler.total_steps == steps and cfg.model.scheduler.warmup_steps == 500
    assert cfg.trainer.max_epochs == epochs


def test_default_is_stage_two_and_a_single_key_still_overrides() -> None:
    cfg = _compose("model.batch_size=2")
    assert cfg.model.stage == 2 and cfg.model.batch_size == 2 and cfg.model.optimizer.lr == pytest.approx(3e-4)
    resolved = OmegaConf.to_container(cfg.model, resolve=True)
    assert resolved["recipe"] == {"batch_size": 6, "lr": 3e-4, "total_steps": 5860, "max_epochs": 10}


def test_an_unknown_stage_is_one_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"model.stage=3 is not valid; choose one of: 1, 2"):
        validate(_compose("model.stage=3"))


def test_the_mini_set_gets_the_batch_its_one_sequence_can_feed_and_a_bigger_one_is_refused_before_any_work(
        tmp_path) -> None:
    """The CPU default (the mini set: 1 train scene) trains batch 1; batch 6 there stops in build_run,
    before the data is generated (the cache stays empty)."""
    from drivebench.app import build_run

    cfg = _compose("data.size=mini")
    assert cfg.model.batch_size == 1 and cfg.model.recipe.batch_size == 6
    bad = _compose("data.size=mini", "model.batch_size=6", f"paths.cache={tmp_path / 'cache'}", "ckpt=none")
    with pytest.raises(ConfigError, match=r"^model.batch_size=6 x 1 rank\(s\) needs 6 driving sequences .* training "
                                          r"split of data.size=mini holds 1: lower model.batch_size to 1"):
        build_run(bad, tmp_path / "run", progress=False)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
