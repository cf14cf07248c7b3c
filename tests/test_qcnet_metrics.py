"""QCNet loss, metrics, constant-velocity baseline and LightningModule, on hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from drivebench.lit.qcnet import QCNetModule, upstream_weight_decay_split
from drivebench.models import create_model
from drivebench.models.qcnet import QCNetLoss, collate_qcnet, make_transform
from drivebench.models.qcnet.loss import laplace_nll, mixture_nll
from drivebench.models.qcnet.metrics import MotionMetrics, constant_velocity_forecast, per_agent_metrics
from drivebench.models.qcnet.random_scenario import random_scenario, upstream_masks


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _hand_case():
    """3 agents, 2 modes, 3 steps; agent 2 has no valid step and must not count."""
    target = torch.tensor([[[1.0, 0], [2, 0], [3, 0]],
                           [[0, 0], [0, 1], [0, 2]],
                           [[0, 0], [0, 0], [0, 0]]])
    pred = torch.tensor([[[[1.0, 0], [2, 0], [3, 0]], [[1, 1], [2, 1], [3, 1]]],
                         [[[0, 0], [0, 4], [9, 9]], [[1, 0], [1, 1], [0, 2]]],
                         [[[5, 5], [5, 5], [5, 5]], [[5, 5], [5, 5], [5, 5]]]])
    valid = torch.tensor([[True, True, True], [True, True, False], [False, False, False]])
    prob = torch.tensor([[0.25, 0.75], [0.5, 0.5], [0.5, 0.5]])
    return pred, target, valid, prob


def test_per_agent_metrics_on_a_hand_computed_case():
    values = per_agent_metrics(*_hand_case()[:3], prob=_hand_case()[3])
    # agent 0: mode 0 is exact. agent 1: FDE at its last valid step (1): mode 0 -> 3, mode 1 -> 1
    torch.testing.assert_close(values["minFDE"][:2], torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(values["minADE"][:2], torch.tensor([0.0, 1.0]))  # mode 1 of agent 1: (1 + 1) / 2
    torch.testing.assert_close(values["brier"][:2], torch.tensor([0.5625, 0.25]))
    torch.testing.assert_close(values["brier_minFDE"][:2], torch.tensor([0.5625, 1.25]))
    assert values["MR"][:2].tolist() == [0.0, 0.0]
    assert values["counted"].tolist() == [True, True, False]

    acc = MotionMetrics(k=6)
    acc.update(*_hand_case()[:3], prob=_hand_case()[3])
    acc.update(*_hand_case()[:3], prob=_hand_case()[3], agent_mask=torch.tensor([False, True, True]))
    got = acc.compute()
    assert acc.count == 3  # 2 + 1 agents; agent 2 never counts
    assert got["minFDE"] == pytest.approx((0 + 1 + 1) / 3)
    assert got["brier_minFDE"] == pytest.approx((0.5625 + 1.25 + 1.25) / 3)
    acc.reset()
    assert acc.compute() == {}


def test_miss_rate_threshold_and_top_k_keeps_the_most_probable_modes():
    target = torch.zeros(1, 2, 2)
    pred = torch.zeros(1, 3, 2, 2)
    pred[0, 0, :, 0] = 2.5  # plausible miss
    pred[0, 1, :, 0] = 1.5  # hit, but least probable
    pred[0, 2, :, 0] = 3.0
    prob = torch.tensor([[0.5, 0.1, 0.4]])
    valid = torch.ones(1, 2, dtype=torch.bool)
    all_modes = per_agent_metrics(pred, target, valid, prob, k=3)
    assert float(all_modes["minFDE"][0]) == pytest.approx(1.5) and float(all_modes["MR"][0]) == 0.0
    top2 = per_agent_metrics(pred, target, valid, prob, k=2)
    assert float(top2["minFDE"][0]) == pytest.approx(2.5) and float(top2["MR"][0]) == 1.0
    assert float(top2["brier"][0]) == pytest.approx((1 - 0.5 / 0.9) ** 2)  # renormalised over the kept modes


def test_constant_velocity_on_a_straight_constant_speed_track_has_no_error():
    from drivebench.models.qcnet.batch import agent_frame_targets

    theta, speed = -2.1, 7.3
    direction = np.array([math.cos(theta), math.sin(theta)])
    t = (np.arange(110) - 49) * 0.1
    position = np.zeros((1, 110, 3), np.float32)
    position[0, :, :2] = np.array([3000.0, 1200.0]) + t[:, None] * speed * direction
    target = torch.from_numpy(agent_frame_targets(position, np.full((1, 110), theta, np.float32), 50))[..., :2]
    forecast = constant_velocity_forecast(torch.tensor(speed * direction[None], dtype=torch.float32),
                                          torch.tensor([theta]), num_steps=60)
    values = per_agent_metrics(forecast.unsqueeze(1), target, torch.ones(1, 60, dtype=torch.bool))
    assert float(values["minADE"][0]) < 0.01 and float(values["minFDE"][0]) < 0.01
    # a turning agent is not straight: the baseline then does miss
    curved = target.clone()
    curved[..., 1] += torch.linspace(0, 5, 60)
    assert float(per_agent_metrics(forecast.unsqueeze(1), curved, torch.ones(1, 60, dtype=torch.bool))["MR"][0]) == 1.0


def test_laplace_and_mixture_nll_by_hand():
    nll = laplace_nll(torch.tensor([0.0]), torch.tensor([2.0]), torch.tensor([1.0]))
    assert float(nll) == pytest.approx(math.log(4.0) + 0.5)
    loc = torch.tensor([[[[0.0, 0.0]], [[1.0, 0.0]]]])  # (N=1, K=2, S=1, D=2)
    scale = torch.ones_like(loc)
    target = torch.tensor([[[1.0, 0.0]]])
    logits = torch.tensor([[0.0, math.log(3.0)]])  # pi = (0.25, 0.75)
    got = mixture_nll(loc, scale, target, logits, torch.ones(1, 1))
    per_mode = torch.tensor([2 * math.log(2) + 1, 2 * math.log(2)])
    want = -torch.log(torch.tensor([0.25, 0.75]) @ torch.exp(-per_mode))
    torch.testing.assert_close(got[0], want)


def test_qcnet_loss_picks_the_best_proposal_and_masks_steps():
    steps = 3
    target = torch.zeros(2, steps, 4)
    target[0, :, 0] = torch.tensor([1.0, 2.0, 3.0])
    mask = torch.tensor([[True, True, True], [False, False, False]])  # agent 1 carries no loss
    loc = torch.zeros(2, 2, steps, 2)
    loc[0, 1, :, 0] = target[0, :, 0]  # mode 1 is exact for agent 0
    loc[1] = 1000.0
    outputs = {"loc_propose_pos": loc, "scale_propose_pos": torch.ones_like(loc),
               "loc_refine_pos": loc.clone(), "scale_refine_pos": torch.ones_like(loc),
               "pi": torch.tensor([[0.0, 0.0], [0.0, 0.0]])}
    losses = QCNetLoss()(outputs, {"agent_predict_mask": mask, "agent_target": target})
    assert float(losses["reg_loss_propose"]) == pytest.approx(2 * math.log(2))  # exact mode, unit scale, 2 dims
    assert float(losses["reg_loss_refine"]) == pytest.approx(2 * math.log(2))
    per_mode = torch.tensor([2 * math.log(2) + 3.0, 2 * math.log(2)])
    assert float(losses["cls_loss"]) == pytest.approx(float(-torch.log(0.5 * torch.exp(-per_mode).sum())), rel=1e-5)


def test_upstream_masks_follow_the_history_and_current_step_rules():
    observed = np.zeros((2, 110), bool)
    observed[0, 10:] = True
    observed[1, :40] = True  # gone before the current step: never predicted
    valid, predict = upstream_masks(observed)
    assert not valid[0, 10] and valid[0, 11] and valid[0, 60]
    assert predict[0, 50:].all() and not predict[0, :50].any() and not predict[1].any()


def _focal_straight_scenario(seed: int) -> dict:
    scenario = random_scenario(num_agents=5, num_polygons=12, seed=seed, extent=50.0)
    agent = scenario["agent"]
    theta, speed = 0.4 + seed, 6.0
    t = (np.arange(110) - 49) * 0.1
    direction = np.array([math.cos(theta), math.sin(theta)], np.float32)
    agent["position"][1, :, :2] = np.array([2150.0, -830.0]) + t[:, None] * speed * direction
    agent["velocity"][1, :, :2] = speed * direction
    agent["heading"][1] = theta
    return scenario


def _module(**kwargs) -> QCNetModule:
    torch.manual_seed(0)
    return QCNetModule(create_model("qcnet", "test"), optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
                       **kwargs)


def test_module_reports_model_and_constant_velocity_metrics_for_focal_agents():
    transform = make_transform("test")
    batch = collate_qcnet([transform(_focal_straight_scenario(seed)) for seed in range(3)])
    module = _module()
    with torch.no_grad():
        outputs = module(batch)
        losses = module.compute_loss(batch, outputs)
    assert torch.isfinite(losses["loss"])
    module.reset_metrics()
    module.update_metrics(batch, outputs)
    metrics = module.compute_metrics()
    assert {"minADE", "minFDE", "MR", "brier", "brier_minFDE", "cv_minADE", "cv_minFDE", "cv_MR"} <= set(metrics)
    assert module.model_metrics.count == 3  # one focal agent per scene
    assert metrics["cv_minFDE"] < 0.01 and metrics["cv_MR"] == 0.0  # the focal agents drive straight
    assert metrics["minFDE"] > metrics["cv_minFDE"]  # an untrained model is worse than the baseline
    assert module.batch_size(batch) == 3


def test_weight_decay_follows_upstreams_split():
    module = _module(no_weight_decay=("to_pi",))
    decay, no_decay = upstream_weight_decay_split(module.net)
    names = {id(p): n for n, p in module.net.named_parameters()}
    decayed = {names[id(p)] for p in decay}
    assert "decoder.traj_emb.weight_ih_l0" in decayed and "decoder.traj_emb.weight_hh_l0" in decayed
    assert "map_encoder.r_pl2pl_emb.weight_in" in decayed and "agent_encoder.t_attn_layers.0.to_q.weight" in decayed
    for name in ("decoder.traj_emb.bias_ih_l0", "decoder.traj_emb_h0", "decoder.mode_emb.weight",
                 "agent_encoder.x_a_emb.freqs.weight", "agent_encoder.x_a_emb.ln_weight",
                 "agent_encoder.t_attn_layers.0.to_q.bias", "agent_encoder.t_attn_layers.0.ff_prenorm.weight"):
        assert name not in decayed, name
    assert len(decay) + len(no_decay) == len(list(module.net.parameters()))
    groups = module.parameter_groups()
    assert groups[1]["weight_decay"] == 0.0
    grouped_no_decay = {names[id(p)] for p in groups[1]["params"]}
    assert "decoder.to_pi.0.weight" in grouped_no_decay  # the extra fragment
    assert sum(len(g["params"]) for g in groups) == len(list(module.net.parameters()))


def test_module_trains_and_validates_in_lightning():
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    transform = make_transform("test")
    scenes = [transform(_focal_straight_scenario(seed)) for seed in range(4)]
    loader = DataLoader(scenes, batch_size=2, collate_fn=collate_qcnet)
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, limit_val_batches=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    module = _module()
    trainer.fit(module, loader, loader)
    logged = trainer.callback_metrics
    assert torch.isfinite(logged["train/loss"]) and "val/minFDE" in logged and "val/cv_minFDE" in logged
