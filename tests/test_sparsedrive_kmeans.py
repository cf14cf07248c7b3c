"""SparseDrive's k-means anchors: what is clustered (hand-made infos), determinism for a seed, the
cache, and the model using them after a real run's preprocessing (embedded mini nuScenes)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from drivebench.models.sparsedrive import kmeans as km
from drivebench.models.sparsedrive.model import DETECTION_CLASSES

CONF = Path(__file__).resolve().parents[1] / "drivebench" / "conf"
SPEC = km.AnchorSpec(num_det=3, num_map=2, num_map_sample=5, class_names=DETECTION_CLASSES, motion=(10, 2, 12),
                     plan=(3, 2, 6))


def _inst(x: float, y: float, yaw: float = 0.0, name: str = "vehicle.car", speed: float = 0.0, steps: int = 12) -> dict:
    fut = np.zeros((12, 2))
    fut[:steps] = speed * 0.5 * np.array([math.cos(yaw), math.sin(yaw)])  # per-step offsets along the heading
    mask = np.zeros(12)
    mask[:steps] = 1
    return {"bbox_3d": [x, y, -1.0, 4.0, 2.0, 1.5, yaw], "category_name": name, "fut_trajs": fut.tolist(),
            "fut_masks": mask.tolist()}


def _record(i: int, instances: list[dict], ego_speed: float, cmd: int, ego_steps: int = 6) -> dict:
    steps = np.zeros((6, 2))
    steps[:, 1] = ego_speed * 0.5  # forward is +y in the LiDAR frame
    mask = np.zeros(6)
    mask[:ego_steps] = 1
    one_hot = [0.0, 0.0, 0.0]
    one_hot[cmd] = 1.0
    return {"token": f"t{i}", "timestamp": float(i), "instances": instances, "gt_ego_fut_trajs": steps.tolist(),
            "gt_ego_fut_masks": mask.tolist(), "gt_ego_fut_cmd": one_hot}


def _records(rng: np.random.Generator) -> list[dict]:
    """Boxes around three places (plus one beyond 55 m), cars driving at 2 or 8 m/s in any heading,
    ego futures at 2 or 10 m/s going straight, and one turning right."""
    places = np.array([[10.0, 0.0], [-20.0, 15.0], [0.0, -30.0]])
    out = []
    for i in range(24):
        insts = [_inst(*(places[k] + rng.normal(0, 0.3, 2)), yaw=rng.uniform(-math.pi, math.pi),
                       speed=(2.0, 8.0)[i % 2]) for k in range(3)]
        insts.append(_inst(70.0, 0.0, speed=20.0))  # beyond 55 m: clustered nowhere
        insts.append(_inst(10.0, 0.0, speed=30.0, steps=6))  # incomplete future: a box, not a motion sample
        out.append(_record(i, insts, ego_speed=(2.0, 10.0)[i % 2], cmd=2))
    out.append(_record(99, [], ego_speed=5.0, cmd=0))
    return out


def test_kmeans_of_hand_made_infos() -> None:
    rng = np.random.default_rng(0)
    records = _records(rng)
    geometry = {"t0": [(0, np.array([[0.0, 0.0], [2.0, 0.0]])), (1, np.array([[10.0, 10.0], [10.0, 14.0]]))]}
    anchors, report = km.compute_anchors(records, geometry, SPEC, seed=0)
    det = anchors["det"]
    assert det.shape == (3, 11) and report["det"] == {"points": 96, "clusters": 3, "default": 0}
    found = sorted(map(tuple, np.round(det[:, :2])))
    assert found == sorted(map(tuple, [(10.0, 0.0), (-20.0, 15.0), (0.0, -30.0)]))
    assert np.all(det[:, 3:7] == 1.0) and np.all(det[:, 7:] == 0.0)  # log sizes 1, heading 90 deg, still
    # map: each element's mean vertex with an 8 m segment along +y (forward in the LiDAR frame)
    mp = anchors["map"].reshape(2, 5, 2)
    assert sorted(map(tuple, mp.mean(axis=1).round(6))) == [(1.0, 0.0), (10.0, 12.0)]
    np.testing.assert_allclose(mp[:, -1] - mp[:, 0], [[0.0, 8.0], [0.0, 8.0]], atol=1e-9)
    # motion: the cars' futures in their own frame: straight ahead at 1 and 4 m per step, whatever the heading
    car = anchors["motion"][DETECTION_CLASSES.index("car")]
    ends = sorted(car[:, -1].round(6).tolist())
    assert ends == [[12.0, 0.0], [48.0, 0.0]]
    assert report["motion"]["car"] == {"points": 72, "clusters": 2, "default": 0}
    ped = DETECTION_CLASSES.index("pedestrian")  # no pedestrians: the default modes stay
    np.testing.assert_array_equal(anchors["motion"][ped], km.default_motion_anchors(10, 2, 12)[ped].numpy())
    # plan: straight at 1 and 5 m per step along +y; one right turn is fewer than 2 modes: default
    straight = anchors["plan"][2]
    assert sorted(straight[:, -1].round(6).tolist()) == [[0.0, 6.0], [0.0, 30.0]]
    assert report["plan"]["right"]["default"] == 2 and report["plan"]["left"]["points"] == 0


def test_too_few_points_keep_defaults_and_seeds_are_deterministic() -> None:
    rng = np.random.default_rng(1)
    records = _records(rng)[:2]
    spec = km.AnchorSpec(num_det=10, num_map=4, num_map_sample=5, class_names=DETECTION_CLASSES, motion=None, plan=None)
    anchors, report = km.compute_anchors(records, {}, spec, seed=0)
    # 8 centres, 7 distinct (the two samples share one box position): 7 anchors, then 3 defaults
    assert report["det"] == {"points": 8, "clusters": 7, "default": 3}
    np.testing.assert_array_equal(anchors["det"][7:], km.default_detection_anchors(10).numpy()[7:])
    assert report["map"]["clusters"] == 0 and np.array_equal(anchors["map"],
                                                            km.default_map_anchors(4, 5).numpy().astype(np.float64))
    points = rng.normal(0, 10, (500, 3))
    a, _ = km.kmeans(points, 20, seed=3)
    b, _ = km.kmeans(points, 20, seed=3)
    c, _ = km.kmeans(points, 20, seed=4)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(np.sort(a, axis=0), np.sort(c, axis=0))  # another seed, another local optimum


def test_anchors_are_cached_by_what_shapes_them(tmp_path, monkeypatch) -> None:
    records = _records(np.random.default_rng(2))
    first, _ = km.kmeans_anchors(records, {}, SPEC, seed=0, cache_dir=tmp_path)
    assert len(list(tmp_path.glob(f"{km.CACHE_NAME}-*.pkl"))) == 1
    calls = []
    real = km.compute_anchors
    monkeypatch.setattr(km, "compute_anchors", lambda *a, **k: calls.append(1) or real(*a, **k))
    again, _ = km.kmeans_anchors(list(reversed(records)), {}, SPEC, seed=0, cache_dir=tmp_path)  # order: same key
    assert calls == [] and all(np.array_equal(first[k], again[k]) for k in first)
    km.kmeans_anchors(records, {}, SPEC, seed=1, cache_dir=tmp_path)  # another seed
    records[0]["instances"][0]["bbox_3d"][0] += 1.0  # other data
    km.kmeans_anchors(records, {}, SPEC, seed=0, cache_dir=tmp_path)
    assert len(calls) == 2 and len(list(tmp_path.glob(f"{km.CACHE_NAME}-*.pkl"))) == 3


def _run(tmp_path: Path, cache: Path, anchors: str):
    import os

    from drivebench.app import build_run

    os.environ["DRIVEBENCH_CACHE"] = str(cache)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["model=sparsedrive", "model.size=test", "data.size=mini", "accel=none",
                                           "ckpt=none", "model.batch_size=1", f"model.module.anchors={anchors}",
                                           f"paths.output_dir={tmp_path}", f"paths.cache={cache}"])
    return build_run(cfg, tmp_path, progress=False)


def test_the_model_trains_from_the_kmeans_anchors_of_the_training_infos(tmp_path, drivebench_cache) -> None:
    import lightning.pytorch as pl

    torch.set_num_threads(1)
    run = _run(tmp_path / "a", drivebench_cache, "kmeans")
    default = {k: v.detach().clone() for k, v in run.module.net.anchor_parameters().items()}
    trainer = pl.Trainer(**run.trainer_kwargs(), logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         limit_val_batches=3)
    metrics = trainer.validate(run.module, datamodule=run.datamodule, verbose=False)[0]
    source = run.datamodule.source
    records = source.infos.split("train")
    from drivebench.data.transforms.map_gt import precompute_map_geometry

    geometry = precompute_map_geometry(records, source.root, cache_dir=source.cache_dir)
    expected, report = km.kmeans_anchors(records, geometry, run.module.net.anchor_spec(), cache_dir=source.cache_dir)
    params = run.module.net.anchor_parameters()
    assert sorted(params) == ["det", "map", "motion", "plan"]
    for kind, value in expected.items():
        torch.testing.assert_close(params[kind].detach(), torch.as_tensor(value, dtype=torch.float32).view_as(params[kind]))
    assert not torch.equal(params["det"], default["det"]) and not torch.equal(params["map"], default["map"])
    assert run.module.anchor_report["source"] == "kmeans" and report["det"]["points"] > 0 and report["map"]["points"] > 0
    assert list((Path(source.cache_dir)).glob(f"{km.CACHE_NAME}-*.pkl"))
    # the validation output carries the nuScenes detection and tracking scores
    for key in ("val/det/NDS", "val/det/mAP", "val/det/mATE", "val/det/mAAE", "val/track/AMOTA", "val/track/AMOTP"):
        assert key in metrics and math.isfinite(metrics[key]), key
    kept = _run(tmp_path / "b", drivebench_cache, "default")
    pl.Trainer(**kept.trainer_kwargs(), logger=False, enable_checkpointing=False, enable_progress_bar=False,
               limit_val_batches=1).validate(kept.module, datamodule=kept.datamodule, verbose=False)
    assert torch.equal(kept.module.net.anchor_parameters()["det"], default["det"])
    assert kept.module.anchor_report == {"source": "default"}


def test_a_bad_anchor_choice_is_a_config_error() -> None:
    from drivebench.errors import ConfigError
    from drivebench.lit.sparsedrive import SparseDriveModule
    from drivebench.models.registry import create_model

    with pytest.raises(ConfigError, match="model.module.anchors='clustered' is not valid"):
        SparseDriveModule(create_model("sparsedrive", "test"), torch.optim.AdamW, anchors="clustered")
