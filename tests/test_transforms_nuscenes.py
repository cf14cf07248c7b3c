"""The camera-model pipelines: CPU/device agreement, seeded augmentation, geometry, map GT, batches."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from drivebench.data.nuscenes.errors import CorruptFileError
from drivebench.data.nuscenes.generate import ensure_generated
from drivebench.data.nuscenes.infos import build_infos
from drivebench.data.transforms import (
    DictImageCache,
    LoadMultiViewImages,
    MapGeometry,
    MapGeometryExtractor,
    NuScenesDataset,
    PhotoMetricDistortionMultiView,
    RandomScaleMultiView,
    ResizeCropFlipRotate,
    VectorizeMap,
    collate,
    gaussianformer_pipeline,
    maptr_device_transform,
    maptr_pipeline,
    precompute_map_geometry,
    record_to_results,
    sparsedrive_device_transform,
    sparsedrive_pipeline,
)
from drivebench.data.transforms import device
from drivebench.data.transforms.image import NormalizeMultiView
from drivebench.data.transforms.map_gt import orderings_maptr_v2, orderings_permute
from drivebench.data.transforms.photometric import apply_photometric, sample_photometric_params
from drivebench.data.sampling import SampleKey
from drivebench.polylines import resample

CONTRACT = Path(__file__).resolve().parents[1] / "docs" / "batch-contract.md"
SMALL_SD = {"final_dim": (48, 128), "resize_lim": (0.75, 0.85)}  # SparseDrive's aug scaled to 160x90 images


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return ensure_generated(tmp_path_factory.mktemp("nusc") / "mini", "mini", seed=0, workers=2, progress=False)


@pytest.fixture(scope="module")
def index(root, tmp_path_factory):
    return build_infos(root, cache_dir=tmp_path_factory.mktemp("cache"))


def _results(index, root, i, seed=0):
    r = record_to_results(index.records[i], root)
    r["rng"] = np.random.default_rng([seed, 0, i])
    r["seq_rng"] = np.random.default_rng([seed, 0, r["sequence_id"], 1 << 20])
    return r


def test_cpu_and_device_photometric_normalise_agree(root, index):
    imgs = LoadMultiViewImages()(_results(index, root, 3))["img"]
    rng = np.random.default_rng(0)
    worst = 0.0
    seen_flags = np.zeros(13, bool)
    for _ in range(8):
        params = sample_photometric_params(rng, len(imgs))
        seen_flags |= params.astype(bool).any(axis=0)
        cpu = NormalizeMultiView()({"img": [apply_photometric(im.astype(np.float32), p) for im, p in zip(imgs, params)]})
        ref = torch.from_numpy(np.stack(cpu["img"]).transpose(0, 3, 1, 2))[None]
        x = torch.from_numpy(np.stack(imgs).transpose(0, 3, 1, 2))[None].float()
        out = device.normalize(device.photometric(x, torch.from_numpy(params)[None]), (123.675, 116.28, 103.53),
                               (58.395, 57.12, 57.375))
        worst = max(worst, (out - ref).abs().max().item())
    assert seen_flags[[0, 3, 5, 7, 9]].all(), "every photometric branch was exercised"
    assert worst < 1e-3


def test_maptr_device_path_matches_the_cpu_path(root, index):
    cpu_ds = NuScenesDataset(index, maptr_pipeline(root), seed=3, root=root)
    dev_ds = NuScenesDataset(index, maptr_pipeline(root, device_images=True), seed=3, root=root)
    cpu = collate([cpu_ds[i] for i in (1, 7)])
    dev = collate([dev_ds[i] for i in (1, 7)])
    assert dev["img_uint8"].dtype == torch.uint8 and dev["photometric_params"].shape == (2, 6, 13)
    out = maptr_device_transform()(dev)
    assert out["img"].shape == cpu["img"].shape
    assert (out["img"] - cpu["img"]).abs().max().item() < 1e-3
    for key in ("lidar2img", "cam_intrinsic", "img_shape"):
        torch.testing.assert_close(out[key], cpu[key])
    np.testing.assert_equal([t.numpy() for t in out["gt_map_pts"]], [t.numpy() for t in cpu["gt_map_pts"]])


def test_compiled_device_path_matches_the_cpu_path(root, index):
    """``accel.compile`` compiles the per-pixel chain of the device transform; same numbers."""
    dev_ds = NuScenesDataset(index, maptr_pipeline(root, device_images=True), seed=3, root=root)
    cpu = collate([NuScenesDataset(index, maptr_pipeline(root), seed=3, root=root)[i] for i in (1, 7)])
    transform = maptr_device_transform()
    transform.compile()
    assert transform.compiled
    out = transform(collate([dev_ds[i] for i in (1, 7)]))
    assert out["img"].shape == cpu["img"].shape
    assert (out["img"] - cpu["img"]).abs().max().item() < 1e-3


def test_the_compiled_pixel_chain_compiles_once():
    """Its constants (the HSV sector table, mean and 1/std) are the graph's own: a lookup in the module's table
    made dynamo guard on the table's keys, and the graph that filled the table failed that guard at its next
    call (a recompile in every compiled run; GaussianFormer on an H100: 3.2 s)."""
    import torch._dynamo

    from drivebench.accel.compile import compile_report

    torch._dynamo.reset()
    device._CONSTS.clear()  # a fresh process: the table is empty when the graph is traced
    transform = device.DeviceImageTransform(photometric=True)
    pixels = torch.compile(transform._pixels_eager, backend="eager", dynamic=False)  # dynamo's guards alone
    x = torch.randint(0, 256, (1, 2, 3, 16, 24), dtype=torch.uint8)
    params = torch.zeros(1, 2, 13)
    params[..., 0], params[..., 7], params[..., 8] = 1.0, 1.0, 30.0  # brightness on, a hue shift: every table read
    params[..., 10:13] = torch.tensor([0.0, 1.0, 2.0])
    outs = [pixels(x, params) for _ in range(3)]
    assert compile_report()["recompiles"] == {"count": 0, "frames": []}
    torch.testing.assert_close(outs[-1], transform._pixels_eager(x, params))
    torch._dynamo.reset()


def test_device_jpeg_decode_matches_cv2(root, index):
    r = LoadMultiViewImages(mode="bytes")(_results(index, root, 2))
    jpegs = [[torch.from_numpy(b) for b in r["img_jpeg"]]]
    decoded = device.decode_jpeg_batch(jpegs, "cpu")
    ref = np.stack([cv2.imread(p) for p in r["img_paths"]]).transpose(0, 3, 1, 2)
    assert decoded.shape == (1, 6, *ref.shape[1:]) and decoded.dtype == torch.uint8
    diff = (decoded[0].float() - torch.from_numpy(ref).float()).abs()
    assert diff.mean().item() < 1.0  # two libjpeg builds: at most rounding differences
    # the whole device-decode recipe gives the CPU pipeline's batch
    ds = NuScenesDataset(index, maptr_pipeline(root, device_decode=True), seed=1, root=root)
    cpu = collate([NuScenesDataset(index, maptr_pipeline(root), seed=1, root=root)[0]])
    out = maptr_device_transform()(collate([ds[0]]), device="cpu")
    assert out["img"].shape == cpu["img"].shape
    assert (out["img"] - cpu["img"]).abs().mean().item() < 0.02


def test_same_seed_and_index_give_the_same_augmentation_in_any_order(root, index):
    def sample(ds, i):
        s = ds[i]
        return s["img"].numpy(), s["lidar2img"].numpy(), [d.numpy() for d in s["gt_depth"]]

    a = NuScenesDataset(index, sparsedrive_pipeline(root, **SMALL_SD, per_sequence_aug=False), seed=5, root=root)
    b = NuScenesDataset(index, sparsedrive_pipeline(root, **SMALL_SD, per_sequence_aug=False), seed=5, root=root)
    for i in (0, 4, 9):
        a[(i + 3) % len(a)]  # unrelated calls in between change nothing
    first = sample(a, 6)
    np.testing.assert_equal(first, sample(b, 6))
    assert not np.array_equal(first[1], sample(a, 7)[1])  # another index: another augmentation
    a.set_epoch(1)
    assert not np.array_equal(first[1], sample(a, 6)[1])  # another epoch too
    c = NuScenesDataset(index, sparsedrive_pipeline(root, **SMALL_SD, per_sequence_aug=False), seed=6, root=root)
    assert not np.array_equal(first[0], sample(c, 6)[0])
    # SparseDrive keeps one geometric augmentation per sequence
    seq = NuScenesDataset(index, sparsedrive_pipeline(root, **SMALL_SD)[:3], seed=5, root=root)
    same_scene = [i for i, r in enumerate(index.records) if r["sequence_id"] == index.records[0]["sequence_id"]]
    m0 = seq.run(same_scene[0])["aug_config"]
    assert seq.run(same_scene[3])["aug_config"] == m0


@pytest.mark.parametrize("aug", [
    {"resize": 0.8, "resize_dims": (128, 72), "crop": (5, 20, 133, 68), "flip": False, "rotate": 0.0},
    {"resize": 0.8, "resize_dims": (128, 72), "crop": (0, 24, 128, 72), "flip": True, "rotate": 0.0},
    {"resize": 0.8, "resize_dims": (128, 72), "crop": (0, 24, 128, 72), "flip": True, "rotate": 4.0},
])
def test_image_geometry_moves_pixels_and_lidar2img_together(root, index, aug, monkeypatch):
    r = _results(index, root, 4)
    h, w = 90, 160
    l2i = r["lidar2img"][0]
    point = np.linalg.inv(r["lidar2cam"][0]) @ np.array([0.8, 0.3, 9.0, 1.0])  # 9 m ahead of CAM_FRONT
    uvw = l2i @ point
    u, v = uvw[:2] / uvw[2]
    img = np.zeros((h, w, 3), np.uint8)
    cv2.circle(img, (int(round(u)), int(round(v))), 2, (255, 255, 255), -1)
    r["img"] = [img] * 6
    r["img_shape"] = [(h, w)] * 6
    t = ResizeCropFlipRotate(final_dim=(48, 128))
    monkeypatch.setattr(t, "sample", lambda *a: dict(aug))
    out = t(r)
    uvw2 = out["lidar2img"][0] @ point
    expect = uvw2[:2] / uvw2[2]
    found = np.array(np.unravel_index(out["img"][0][..., 0].astype(float).argmax(), (48, 128)))[::-1]
    assert np.linalg.norm(found - expect) < 2.0
    k_new = out["cam_intrinsic"][0]
    pc = r["lidar2cam"][0] @ point
    np.testing.assert_allclose(k_new @ pc[:3] / pc[2], np.r_[expect, 1.0], atol=1e-9)
    # the device warp redoes the same pixels from the original image and img_aug_matrix
    x = torch.from_numpy(img.transpose(2, 0, 1))[None, None].float()
    warped = device.warp_affine(x, torch.from_numpy(out["img_aug_matrix"][:1])[None], (48, 128))
    found_dev = np.array(np.unravel_index(warped[0, 0, 0].argmax().item(), (48, 128)))[::-1]
    assert np.linalg.norm(found_dev - expect) < 2.0


def test_random_scale_matches_intrinsics(root, index):
    r = LoadMultiViewImages(to_float32=True)(_results(index, root, 0))
    k0, l2i0 = r["cam_intrinsic"].copy(), r["lidar2img"].copy()
    out = RandomScaleMultiView([0.5])(r)
    assert out["img"][0].shape[:2] == (45, 80) and out["img_shape"][0] == (45, 80)
    np.testing.assert_allclose(out["cam_intrinsic"][:, :2], k0[:, :2] * 0.5)
    np.testing.assert_allclose(out["lidar2img"][:, :2], l2i0[:, :2] * 0.5)


def test_depth_maps_hold_lidar_depths(root, index):
    steps = sparsedrive_pipeline(root, **SMALL_SD, depth_strides=(1, 4))[:4]  # load, points, augment, depth
    res = NuScenesDataset(index, steps, seed=0, root=root).run(5)
    fine = res["gt_depth"][0]
    assert fine.shape == (6, 48, 128) and res["gt_depth"][1].shape == (6, 12, 32)
    assert (fine > 0).mean() > 0.02 and fine.max() <= 60.0
    pts = np.fromfile(res["lidar_path"], np.float32).reshape(-1, 5)[:, :3]
    uvd = pts @ res["lidar2img"][0][:3, :3].T + res["lidar2img"][0][:3, 3]
    d = uvd[:, 2]
    ok = d > 0.1
    u = np.round(uvd[ok, 0] / d[ok]).astype(int)
    v = np.round(uvd[ok, 1] / d[ok]).astype(int)
    inside = (u >= 0) & (u < 128) & (v >= 0) & (v < 48)
    vv, uu = np.nonzero(fine[0])
    for y, x in zip(vv[:50], uu[:50]):  # every filled pixel holds the nearest point projected there
        here = inside & (u == x) & (v == y)
        assert fine[0, y, x] == pytest.approx(d[ok][here].min(), rel=1e-5)


def test_map_gt_classes_points_and_orderings(root, index):
    ex = MapGeometryExtractor(root)
    labels_seen = set()
    for i in range(0, len(index), 3):
        r = MapGeometry(ex)(_results(index, root, i))
        out = VectorizeMap("maptr_v2")(r)
        pts, labels, counts = out["gt_map_pts"], out["gt_map_labels"], out["gt_map_num_orderings"]
        assert pts.shape == (len(labels), 19, 20, 2)
        labels_seen |= set(labels.tolist())
        for (label, coords), p, n in zip(r["map_instances"], pts, counts):
            real, pad = p[:n], p[n:]
            assert (pad == -10000).all() and (np.abs(real[..., 0]) <= 15).all() and (np.abs(real[..., 1]) <= 30).all()
            if np.array_equal(coords[0], coords[-1]):  # polygon: closed, every ordering a cyclic shift
                assert n == min(len(coords) - 1, 19)
                np.testing.assert_allclose(real[:, 0], real[:, -1], atol=1e-6)
            else:  # polyline: forward and reverse
                assert n == 2
                np.testing.assert_allclose(real[1], real[0][::-1])
        sd = VectorizeMap("permute")(dict(r, rng=np.random.default_rng(0)))
        assert sd["gt_map_pts"].shape[1] == 38
    assert labels_seen == {0, 1, 2}


def test_resampling_and_shifts_equal_upstream_shapely_formulas():
    from shapely.geometry import LineString

    rng = np.random.default_rng(0)
    line = np.cumsum(rng.normal(size=(7, 2)), axis=0)
    ref = np.array([LineString(line).interpolate(d).coords[0] for d in np.linspace(0, LineString(line).length, 20)])
    np.testing.assert_allclose(resample(line, 20), ref, atol=1e-9)
    ring = np.array([[0.0, 0.0], [4.0, 0.0], [5.0, 3.0], [1.0, 4.0], [0.0, 0.0]])
    ours = orderings_maptr_v2(ring, 20, rng, 19)
    upstream = []  # MapTR v1 shift_fixed_num_sampled_points_v2, written out with shapely
    for i in range(len(ring) - 1):
        shifted = np.roll(ring[:-1], i, axis=0)
        shifted = np.concatenate([shifted, shifted[:1]])
        ls = LineString(shifted)
        upstream.append([ls.interpolate(d).coords[0] for d in np.linspace(0, ls.length, 20)])
    np.testing.assert_allclose(ours, np.array(upstream), atol=1e-9)
    many = np.concatenate([np.stack([np.cos(a), np.sin(a)], 1) for a in [np.linspace(0, 2 * np.pi, 31)]])
    many[-1] = many[0]
    assert orderings_maptr_v2(many, 20, rng, 19).shape == (19, 20, 2)  # a random 19 of 30 shifts
    perm = orderings_permute(ring, 20)
    assert perm.shape == (38, 20, 2)
    np.testing.assert_allclose(perm[:, 0], perm[:, -1])


def test_precomputed_map_geometry_gives_the_same_ground_truth(root, index, tmp_path):
    pre = precompute_map_geometry(index.records, root, workers=2, cache_dir=tmp_path)
    assert set(pre) == {r["token"] for r in index.records}
    ex = MapGeometryExtractor(root)
    for i in (0, 7, 13):
        a = VectorizeMap()(MapGeometry(ex)(_results(index, root, i)))
        b = VectorizeMap()(MapGeometry(pre)(_results(index, root, i)))
        np.testing.assert_equal(a["gt_map_pts"], b["gt_map_pts"])
        np.testing.assert_equal(a["gt_map_labels"], b["gt_map_labels"])
    again = precompute_map_geometry(index.records, root, workers=0, cache_dir=tmp_path)
    assert again.keys() == pre.keys()


def _contract_keys() -> dict[str, str]:
    text = CONTRACT.read_text()
    camera = text[text.index("## Camera models"):text.index("## Trajectory model")]
    return dict(re.findall(r"^\| `(\w+)` \| ([^|]+)\|", camera, flags=re.M))


def test_collated_batches_have_exactly_the_contract_keys(root, index):
    contract = _contract_keys()
    pipes = {
        "maptr": maptr_pipeline(root),
        "sparsedrive": sparsedrive_pipeline(root, **SMALL_SD),
        "gaussianformer": gaussianformer_pipeline(root, final_dim=(80, 160)),
    }
    union = set()
    for name, pipe in pipes.items():
        ds = NuScenesDataset(index, pipe, seed=0, root=root)
        batch = collate([ds[0], ds[1], ds[2]])
        assert set(batch) <= set(contract), f"{name}: keys outside the contract {set(batch) - set(contract)}"
        union |= set(batch)
        assert batch["img"].dtype == torch.float32 and batch["img"].shape[:3] == (3, 6, 3)
        assert batch["img_shape"].dtype == torch.long and batch["timestamp"].dtype == torch.float64
        assert batch["prev_exists"].dtype == torch.bool and batch["can_bus"].shape == (3, 18)
        assert batch["lidar2img"].shape == (3, 6, 4, 4) and batch["cam2lidar"].shape == (3, 6, 4, 4)
        for key in ("gt_map_pts", "gt_boxes_3d", "gt_agent_fut_trajs"):
            if key in batch:
                assert isinstance(batch[key], list) and len(batch[key]) == 3
        if name == "sparsedrive":
            assert batch["gt_boxes_3d"][0].shape[1] == 9 and batch["gt_ego_fut_trajs"].shape == (3, 6, 2)
            assert batch["gt_ego_fut_cmd"].shape == (3, 3) and batch["ego_status"].shape == (3, 10)
            assert isinstance(batch["gt_depth"], list) and batch["gt_depth"][0].shape[:2] == (3, 6)
            assert set(batch["gt_labels_3d"][0].tolist()) <= set(range(10))
            attrs = torch.cat(batch["gt_attr_labels"])  # the annotations' attributes, for the metric's AAE
            assert attrs.dtype == torch.long and (attrs >= 0).any() and attrs.max() < 8
            assert batch["gt_velocity_valid"][0].dtype == torch.bool
        if name == "gaussianformer":
            assert batch["occ_label"].shape == (3, 200, 200, 16) and batch["occ_label"].dtype == torch.long
            assert batch["occ_mask"].all() and batch["occ_label"].max() == 17
    assert len(contract) >= 25 and union == set(contract)
    # accel variants add only the raw image keys the contract names (plus what the device needs)
    dev = collate([NuScenesDataset(index, sparsedrive_pipeline(root, **SMALL_SD, device_decode=True), root=root)[0]])
    assert {"img_jpeg", "photometric_params", "img_aug_matrix"} <= set(dev) and "img" not in dev
    out = sparsedrive_device_transform(final_dim=SMALL_SD["final_dim"], device_decode=True)(dev, device="cpu")
    assert out["img"].shape == (1, 6, 3, *SMALL_SD["final_dim"])


def test_prev_exists_comes_from_the_sampler(root, index):
    ds = NuScenesDataset(index, maptr_pipeline(root), root=root)
    assert not ds[3]["prev_exists"] and ds[(3, True)]["prev_exists"]


def test_image_cache_is_consulted_before_decoding(root, index):
    cache = DictImageCache()
    ds = NuScenesDataset(index, gaussianformer_pipeline(root, image_cache=cache, final_dim=(80, 160), rand_flip=False),
                         root=root)
    first = ds[2]["img"]
    assert cache.misses == 6 and len(cache) == 6
    second = ds[2]["img"]
    assert cache.hits == 6
    torch.testing.assert_close(first, second)
    assert all(not a.flags.writeable for a in cache._store.values())


def test_corrupt_image_fails_or_is_skipped_and_counted(root, index, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    bad = copy / index.records[4]["images"]["CAM_FRONT_LEFT"]["img_path"]
    bad.write_bytes(b"\xff\xd8" + b"\x00" * 100 + b"\xff\xd9")
    strict = NuScenesDataset(index, [LoadMultiViewImages()], root=copy)
    with pytest.raises(CorruptFileError) as err:
        strict[4]
    assert str(bad) in str(err.value) and index.records[4]["token"] in str(err.value)
    lenient = NuScenesDataset(index, [LoadMultiViewImages()], root=copy, on_corrupt="skip")
    out = lenient[4]
    assert out["token"] == index.records[5]["token"] and sum(lenient.skipped.values()) == 1
    with pytest.raises(ValueError, match="on_corrupt"):
        NuScenesDataset(index, [], root=copy, on_corrupt="ignore")


def test_photometric_params_come_from_the_sample_rng(root, index):
    r1 = PhotoMetricDistortionMultiView(apply=False)({"img": [None] * 6, "rng": np.random.default_rng([0, 0, 4])})
    r2 = PhotoMetricDistortionMultiView(apply=False)({"img": [None] * 6, "rng": np.random.default_rng([0, 0, 4])})
    r3 = PhotoMetricDistortionMultiView(apply=False)({"img": [None] * 6, "rng": np.random.default_rng([0, 0, 5])})
    np.testing.assert_equal(r1["photometric_params"], r2["photometric_params"])
    assert not np.array_equal(r1["photometric_params"], r3["photometric_params"])


def test_augmentation_follows_the_epoch_that_comes_with_the_index(root, index):
    """The training loader hands ``SampleKey(index, epoch)``: a new epoch draws a new augmentation
    for the same sample (workers never see the main process's ``set_epoch``), the same key the same."""
    ds = NuScenesDataset(index, maptr_pipeline(root, device_images=True), seed=3, root=root)
    params = lambda item: np.asarray(ds[item]["photometric_params"])  # noqa: E731
    e0 = params(SampleKey(2, 0))
    np.testing.assert_equal(params(SampleKey(2, 0)), e0)
    assert not np.array_equal(params(SampleKey(2, 1)), e0)
    np.testing.assert_equal(params(2), e0)  # a plain index: the epoch of set_epoch (0)


def test_a_run_that_decodes_on_the_device_records_the_decode_in_its_summary(tmp_path, drivebench_cache):
    """``settings.device_decode`` tells the report that this run's decode had a stream of its own (runs without it,
    on a GPU, decoded under torchvision's memory hazard); ``accel.device_transform=decode`` runs on the CPU too."""
    import json

    from conftest import run_cli

    out = tmp_path / "run"
    result = run_cli(["model=maptr", "model.size=test", "data.size=mini", "accel=none", "accel.device_transform=decode",
                      "bench.ceiling=false", "bench.val_batches=0", "bench.warmup_steps=1", "bench.steps=2", "ckpt=none",
                      f"hydra.run.dir={out}"], drivebench_cache, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert settings["device_decode"] == device.DEVICE_DECODE
    assert any(change.startswith("device_transform=decode") for change in settings["numerics_changed_by"])
