"""Reading a sample's files: multi-view JPEGs (decoded or as bytes), LiDAR points, occupancy.

Errors name the file and the sample token (``DataFileError``); the dataset's ``on_corrupt`` policy
decides whether they stop training or drop the sample.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import cv2
import numpy as np

from drivebench.data.nuscenes.errors import CorruptFileError, MissingFileError


class ImageCache(Protocol):
    """What the loader needs from a cache of decoded images (a shared-memory one lives in accel/)."""

    def get(self, path: str) -> np.ndarray | None: ...


class DictImageCache:
    """In-process cache of decoded images keyed by path: for tests and single-process runs."""

    def __init__(self) -> None:
        self._store: dict[str, np.ndarray] = {}
        self.hits = 0
        self.misses = 0

    def get(self, path: str) -> np.ndarray | None:
        img = self._store.get(path)
        if img is None:
            self.misses += 1
        else:
            self.hits += 1
        return img

    def put(self, path: str, img: np.ndarray) -> None:
        img = np.ascontiguousarray(img)
        img.flags.writeable = False  # shared by later samples: nothing may edit it in place
        self._store[path] = img

    def __len__(self) -> int:
        return len(self._store)


def read_file(path: str, sample_token: str, kind: str) -> np.ndarray:
    try:
        return np.fromfile(path, dtype=np.uint8)
    except FileNotFoundError:
        raise MissingFileError(path, sample_token, kind) from None


def decode_jpeg(path: str, sample_token: str) -> np.ndarray:
    buf = read_file(path, sample_token, "image")
    img = cv2.imdecode(buf, cv2.IMREAD_COLOR) if len(buf) else None
    if img is None:
        raise CorruptFileError(path, sample_token, "image does not decode as JPEG")
    return img


class LoadMultiViewImages:
    """Decode the 6 views with cv2 (BGR, as mmcv.imread), or keep their JPEG bytes for the device.

    ``image_cache.get(path)`` is asked before decoding; a cache with ``put`` is filled on a miss.
    ``to_float32`` mirrors upstream's ``LoadMultiViewImageFromFiles(to_float32=True)``.
    """

    def __init__(self, to_float32: bool = False, image_cache: ImageCache | None = None, mode: str = "decode") -> None:
        if mode not in ("decode", "bytes"):
            raise ValueError(f"mode={mode!r} is not valid; choose decode or bytes")
        self.to_float32 = to_float32
        self.image_cache = image_cache
        self.mode = mode

    def __call__(self, results: dict) -> dict:
        token = results.get("token", "")
        if self.mode == "bytes":
            jpegs = []
            for path in results["img_paths"]:
                buf = read_file(path, token, "image")
                if len(buf) < 4 or buf[0] != 0xFF or buf[1] != 0xD8:
                    raise CorruptFileError(path, token, "not a JPEG (no SOI marker)")
                jpegs.append(buf)
            results["img_jpeg"] = jpegs
            results["img_shape"] = [tuple(hw) for hw in results["img_hw"]]
            results["ori_shape"] = list(results["img_shape"])
            return results
        imgs = []
        cache = self.image_cache
        for path in results["img_paths"]:
            img = cache.get(path) if cache is not None else None
            if img is None:
                img = decode_jpeg(path, token)
                if cache is not None and hasattr(cache, "put"):
                    cache.put(path, img)
            imgs.append(img.astype(np.float32) if self.to_float32 else img)
        results["img"] = imgs
        results["img_shape"] = [im.shape[:2] for im in imgs]
        results["ori_shape"] = list(results["img_shape"])
        return results


class LoadPoints:
    """LIDAR_TOP key-frame points, float32 (N, 5): x, y, z, intensity, ring (sensor frame)."""

    def __init__(self, use_dims: int = 5) -> None:
        self.use_dims = use_dims

    def __call__(self, results: dict) -> dict:
        path = results["lidar_path"]
        token = results.get("token", "")
        buf = read_file(path, token, "point cloud")
        if len(buf) == 0 or len(buf) % 20:
            raise CorruptFileError(path, token, f"point file of {len(buf)} bytes is not N x 5 float32")
        pts = buf.view(np.float32).reshape(-1, 5)[:, : self.use_dims]
        if not np.isfinite(pts[:, :3]).all():
            raise CorruptFileError(path, token, "point file holds NaN or inf coordinates")
        results["points"] = pts
        return results


class LoadOccupancy:
    """SurroundOcc sparse labels -> dense ``occ_label`` (200, 200, 16) int64, 17 = empty, and
    ``occ_mask`` (labels != 0, as upstream GaussianFormer)."""

    def __call__(self, results: dict) -> dict:
        from drivebench.data.nuscenes.occupancy import densify

        path = results.get("occ_path") or ""
        token = results.get("token", "")
        if not path:
            raise MissingFileError(str(Path(results.get("root", ".")) / "occupancy"), token, "occupancy label")
        try:
            sparse = np.load(path)
        except FileNotFoundError:
            raise MissingFileError(path, token, "occupancy label") from None
        except ValueError as err:
            raise CorruptFileError(path, token, f"occupancy label does not load ({err})") from None
        if sparse.ndim != 2 or sparse.shape[1] != 4:
            raise CorruptFileError(path, token, f"occupancy label has shape {sparse.shape}, expected (K, 4)")
        results["occ_label"], results["occ_mask"] = densify(sparse.astype(np.int64))
        return results


class RegridOccupancy:
    """Crop and coarsen the dense SurroundOcc labels to a model's own grid (small test sizes).

    Each coarse voxel takes the most frequent non-empty class among the fine voxels it covers, or
    empty when all are empty; ``occ_mask`` is recomputed (label != 0). The coarse grid must align
    with the fine one (its lower corner on fine voxel borders, its voxel a whole multiple).
    """

    def __init__(self, lower: tuple[float, float, float], shape: tuple[int, int, int], voxel: float,
                 source_lower: tuple[float, float, float] = (-50.0, -50.0, -5.0), source_voxel: float = 0.5,
                 empty: int = 17, num_classes: int = 18) -> None:
        ratio = voxel / source_voxel
        if abs(ratio - round(ratio)) > 1e-6 or ratio < 1:
            raise ValueError(f"occupancy voxel {voxel} is not a whole multiple of the label voxel {source_voxel}")
        self.k = int(round(ratio))
        self.start = [int(round((lo - slo) / source_voxel)) for lo, slo in zip(lower, source_lower)]
        self.shape = tuple(int(v) for v in shape)
        self.empty = empty
        self.num_classes = num_classes

    def __call__(self, results: dict) -> dict:
        fine = results["occ_label"]
        k = self.k
        sx, sy, sz = self.start
        nx, ny, nz = self.shape
        crop = fine[sx:sx + nx * k, sy:sy + ny * k, sz:sz + nz * k]
        if crop.shape != (nx * k, ny * k, nz * k):
            raise ValueError(f"occupancy grid {self.shape} x {k} does not fit inside the label grid {fine.shape}")
        blocks = crop.reshape(nx, k, ny, k, nz, k).transpose(0, 2, 4, 1, 3, 5).reshape(nx, ny, nz, -1)
        counts = np.stack([(blocks == c).sum(-1) for c in range(self.num_classes)], -1)
        counts[..., self.empty] = 0
        coarse = np.where(counts.max(-1) > 0, counts.argmax(-1), self.empty).astype(np.int64)
        results["occ_label"], results["occ_mask"] = coarse, coarse != 0
        return results
