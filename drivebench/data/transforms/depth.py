"""LiDAR depth targets in each augmented camera at several feature strides (SparseDrive's
``MultiScaleDepthMapGenerator``), with 0 where no point falls (upstream uses -1)."""

from __future__ import annotations

import numpy as np


class LidarDepthMaps:
    def __init__(self, strides=(4, 8, 16), max_depth: float = 60.0, min_depth: float = 0.1) -> None:
        self.strides = tuple(strides)
        self.max_depth = max_depth
        self.min_depth = min_depth

    def __call__(self, results: dict) -> dict:
        pts = results["points"][:, :3].astype(np.float64)
        levels: list[list[np.ndarray]] = [[] for _ in self.strides]
        for lidar2img, (h, w) in zip(results["lidar2img"], results["img_shape"]):
            uvd = pts @ lidar2img[:3, :3].T + lidar2img[:3, 3]
            d = uvd[:, 2]
            front = d >= self.min_depth
            uv = uvd[front, :2] / d[front, None]
            d = d[front]
            u = np.round(uv[:, 0]).astype(np.int64)
            v = np.round(uv[:, 1]).astype(np.int64)
            inside = (u >= 0) & (u < w) & (v >= 0) & (v < h)
            u, v, d = u[inside], v[inside], np.clip(d[inside], self.min_depth, self.max_depth)
            order = np.argsort(-d)  # far first, so the nearest point of a pixel is written last
            u, v, d = u[order], v[order], d[order]
            for k, s in enumerate(self.strides):
                dm = np.zeros((int(h / s), int(w / s)), np.float32)
                uu, vv = np.floor(u / s).astype(np.int64), np.floor(v / s).astype(np.int64)
                ok = (uu < dm.shape[1]) & (vv < dm.shape[0])
                dm[vv[ok], uu[ok]] = d[ok]
                levels[k].append(dm)
        results["gt_depth"] = [np.stack(lv) for lv in levels]
        return results
