"""Vectorised HD-map ground truth: MapTR v1's extraction, 20-point resampling and orderings.

Two steps, so the expensive one can be done once:
1. Geometry (``MapGeometryExtractor``): the map API and shapely clip road/lane dividers, ped
   crossings and road boundaries to the 30 m x 60 m patch around the LiDAR (x in [-15, 15],
   y in [-30, 30] of the LIDAR_TOP frame) -- augmentation-independent, so
   ``precompute_map_geometry`` runs it for every sample in a process pool and caches it.
2. Vectorisation (``VectorizeMap``): resample each element to 20 points and list its equivalent
   orderings, MapTR v1's ``shift_fixed_num_sampled_points_v2`` (polygons: every cyclic shift of
   the vertex ring, one direction, a random 19 of them when there are more; polylines: forward and
   reverse; S = 19) or SparseDrive's permutation of the 20 points (both directions, S = 38).
   Orderings beyond the real ones are filled with -10000, as upstream.

Classes: 0 divider, 1 ped_crossing, 2 boundary.
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from drivebench.accel.threads import pool_kwargs
from drivebench.data.nuscenes.cache import cached, file_fingerprint
from drivebench.polylines import resample

DIVIDER, PED_CROSSING, BOUNDARY = 0, 1, 2
MAP_LOCATIONS = ("boston-seaport", "singapore-hollandvillage", "singapore-onenorth", "singapore-queenstown")


def _lines(geom) -> list:
    """LineStrings inside any geometry (points and polygons dropped)."""
    if geom is None or geom.is_empty:
        return []
    if geom.geom_type == "LineString":
        return [geom]
    if geom.geom_type in ("MultiLineString", "GeometryCollection"):
        return [g for part in geom.geoms for g in _lines(part)]
    return []


def _oriented_ring(ring, clockwise: bool):
    """The Shapely-2 way of MapTR's ``ext.coords = list(ext.coords)[::-1]`` (rings are immutable)."""
    from shapely.geometry import LineString

    coords = list(ring.coords)
    if ring.is_ccw == clockwise:
        coords = coords[::-1]
    return LineString(coords)


class MapGeometryExtractor:
    """Per-process map-API access; ``extract`` returns [(label, (K, 2) float64 coords)]."""

    def __init__(self, dataroot: str | Path, patch_size: tuple[float, float] = (60.0, 30.0),
                 merge_dividers: bool = False) -> None:
        self.dataroot = str(dataroot)
        self.patch_size = tuple(patch_size)  # (along LiDAR y, along LiDAR x) as MapTR's (h, w)
        self.merge_dividers = merge_dividers
        self._maps: dict = {}

    def __getstate__(self) -> dict:  # workers reload the maps themselves
        return {"dataroot": self.dataroot, "patch_size": self.patch_size, "merge_dividers": self.merge_dividers,
                "_maps": {}}

    def explorer(self, location: str):
        if location not in self._maps:
            from nuscenes.map_expansion.map_api import NuScenesMap, NuScenesMapExplorer

            path = Path(self.dataroot) / "maps" / "expansion" / f"{location}.json"
            if not path.exists():
                from drivebench.data.nuscenes.errors import MissingFileError

                raise MissingFileError(str(path), "", "map expansion")
            try:
                self._maps[location] = NuScenesMapExplorer(NuScenesMap(dataroot=self.dataroot, map_name=location))
            except (ValueError, KeyError) as err:  # a truncated file: JSONDecodeError names a column, not the file
                from drivebench.data.nuscenes.errors import CorruptFileError

                raise CorruptFileError(str(path), "", f"map expansion is not valid nuScenes map JSON "
                                       f"({type(err).__name__}: {str(err)[:160]})") from None
        return self._maps[location]

    def extract(self, location: str, lidar2global: np.ndarray) -> list[tuple[int, np.ndarray]]:
        from shapely import ops
        from shapely.geometry import MultiPolygon, box

        explorer = self.explorer(location)
        yaw = float(np.degrees(np.arctan2(lidar2global[1, 0], lidar2global[0, 0])))
        patch_box = (float(lidar2global[0, 3]), float(lidar2global[1, 3]), self.patch_size[0], self.patch_size[1])
        max_x, max_y = self.patch_size[1] / 2, self.patch_size[0] / 2
        out: list[tuple[int, np.ndarray]] = []

        dividers = []
        for layer in ("road_divider", "lane_divider"):
            for geom in explorer._get_layer_line(patch_box, yaw, layer):
                dividers.extend(_lines(geom))
        if self.merge_dividers and dividers:
            dividers = _lines(ops.linemerge(dividers))
        out.extend((DIVIDER, np.asarray(line.coords)[:, :2]) for line in dividers)

        def contours(polys, patch, exterior_clockwise: bool):
            union = ops.unary_union(polys)
            if union.is_empty:
                return []
            parts = list(union.geoms) if union.geom_type == "MultiPolygon" else [union]
            rings = [_oriented_ring(p.exterior, exterior_clockwise) for p in parts if p.geom_type == "Polygon"]
            rings += [_oriented_ring(h, not exterior_clockwise) for p in parts if p.geom_type == "Polygon"
                      for h in p.interiors]
            result = []
            for ring in rings:
                lines = ring.intersection(patch)
                if lines.geom_type == "MultiLineString":
                    lines = ops.linemerge(lines)
                result.extend(_lines(lines))
            return result

        peds = explorer._get_layer_polygon(patch_box, yaw, "ped_crossing")
        ped_patch = box(-max_x - 0.2, -max_y - 0.2, max_x + 0.2, max_y + 0.2)
        out.extend((PED_CROSSING, np.asarray(line.coords)[:, :2]) for line in contours(peds, ped_patch, True))

        roads = explorer._get_layer_polygon(patch_box, yaw, "road_segment")
        lanes = explorer._get_layer_polygon(patch_box, yaw, "lane")
        union = ops.unary_union([ops.unary_union(roads), ops.unary_union(lanes)])
        polys = [union] if not isinstance(union, MultiPolygon) else list(union.geoms)
        bound_patch = box(-max_x + 0.2, -max_y + 0.2, max_x - 0.2, max_y - 0.2)
        out.extend((BOUNDARY, np.asarray(line.coords)[:, :2]) for line in contours(polys, bound_patch, True))
        return [(label, c) for label, c in out if len(c) >= 2]


def orderings_maptr_v2(coords: np.ndarray, n: int, rng: np.random.Generator, max_orderings: int) -> np.ndarray:
    """MapTR v1 ``shift_fixed_num_sampled_points_v2`` for one element: (k <= max_orderings, n, 2)."""
    closed = bool(np.array_equal(coords[0], coords[-1]))
    if not closed:
        s = resample(coords, n)
        return np.stack([s, s[::-1]])[:max_orderings]
    ring = coords[:-1]
    m = len(ring)
    seg = np.linalg.norm(np.roll(ring, -1, axis=0) - ring, axis=1)
    cum = np.concatenate([[0.0], np.cumsum(seg)])  # arc length at ring vertices, closing vertex last
    length = cum[-1]
    starts = (-np.arange(m)) % m  # np.roll(ring, i) starts at vertex -i
    d = (cum[starts][:, None] + np.linspace(0.0, length, n)[None, :])
    d = np.where(d > length, d - length, d)
    d[:, -1] = cum[starts]  # the last sample is the start vertex again
    xs = np.interp(d, cum, np.append(ring[:, 0], ring[0, 0]))
    ys = np.interp(d, cum, np.append(ring[:, 1], ring[0, 1]))
    shifts = np.stack([xs, ys], axis=-1)
    if len(shifts) > max_orderings:
        shifts = shifts[rng.choice(len(shifts), max_orderings, replace=False)]
    return shifts


def orderings_permute(coords: np.ndarray, n: int) -> np.ndarray:
    """SparseDrive's ``permute_line`` on the n resampled points: closed -> 2(n-1) shifts, open -> 2."""
    line = resample(coords, n)
    if np.allclose(line[0], line[-1], atol=1e-3):
        ring = line[:-1]
        shifted = [np.roll(ring, i, axis=0) for i in range(n - 1)]
        shifted += [np.roll(ring[::-1], i, axis=0) for i in range(n - 1)]
        arr = np.stack(shifted)
        return np.concatenate([arr, arr[:, :1]], axis=1)
    return np.stack([line, line[::-1]])


class MapGeometry:
    """Put the element geometry of the sample's patch in ``results["map_instances"]``: from a
    ``MapGeometryExtractor`` (map API + shapely per sample, as upstream MapTR) or from a
    precomputed {sample token: instances} mapping (no shapely work per sample)."""

    def __init__(self, source: MapGeometryExtractor | dict) -> None:
        self.source = source

    def __call__(self, results: dict) -> dict:
        if isinstance(self.source, MapGeometryExtractor):
            results["map_instances"] = self.source.extract(results["map_location"], results["lidar2global"])
        else:
            try:
                results["map_instances"] = self.source[results["token"]]
            except KeyError:
                raise KeyError(f"sample {results['token']} has no precomputed map geometry; rebuild the "
                               "precomputed map GT for these infos") from None
        return results


class VectorizeMap:
    """Geometry -> ``gt_map_labels`` (n,), ``gt_map_pts`` (n, S, 20, 2), ``gt_map_num_orderings``."""

    def __init__(self, ordering: str = "maptr_v2", num_points: int = 20, padding_value: float = -10000.0,
                 patch_size: tuple[float, float] = (60.0, 30.0)) -> None:
        if ordering not in ("maptr_v2", "permute"):
            raise ValueError(f"ordering={ordering!r} is not valid; choose maptr_v2 (MapTR v1) or permute (SparseDrive)")
        self.ordering = ordering
        self.num_points = num_points
        self.padding_value = padding_value
        self.max_x, self.max_y = patch_size[1] / 2, patch_size[0] / 2
        self.num_orderings = num_points - 1 if ordering == "maptr_v2" else 2 * (num_points - 1)

    def __call__(self, results: dict) -> dict:
        insts = results["map_instances"]
        n, s = self.num_points, self.num_orderings
        pts = np.full((len(insts), s, n, 2), self.padding_value, np.float32)
        counts = np.zeros(len(insts), np.int64)
        labels = np.array([label for label, _ in insts], np.int64)
        for i, (_, coords) in enumerate(insts):
            coords = np.asarray(coords, np.float64)
            if self.ordering == "maptr_v2":
                o = orderings_maptr_v2(coords, n, results["rng"], s)
            else:
                o = orderings_permute(coords, n)
            o[..., 0] = np.clip(o[..., 0], -self.max_x, self.max_x)
            o[..., 1] = np.clip(o[..., 1], -self.max_y, self.max_y)
            pts[i, : len(o)] = o
            counts[i] = len(o)
        results["gt_map_labels"] = labels
        results["gt_map_pts"] = pts
        results["gt_map_num_orderings"] = counts
        return results


# ----------------------------------------------------------------------------------------------
# Precompute for every sample (process pool, cached on disk).

_EXTRACTOR: dict = {}


def _extract_chunk(args) -> list[tuple[str, list]]:
    jobs, dataroot, patch_size, merge = args
    ex = _EXTRACTOR.get("ex")
    if ex is None or ex.dataroot != dataroot or ex.patch_size != tuple(patch_size) or ex.merge_dividers != merge:
        ex = _EXTRACTOR["ex"] = MapGeometryExtractor(dataroot, patch_size, merge)
    out = []
    for token, location, l2g in jobs:
        insts = ex.extract(location, np.asarray(l2g))
        out.append((token, [(label, c.astype(np.float64)) for label, c in insts]))
    return out


def lidar2global_of(record: dict) -> np.ndarray:
    return np.asarray(record["ego2global"]) @ np.asarray(record["lidar_points"]["lidar2ego"])


def precompute_map_geometry(
    records: list[dict],
    dataroot: str | Path,
    workers: int = 0,
    cache_dir: str | Path | None = None,
    patch_size: tuple[float, float] = (60.0, 30.0),
    merge_dividers: bool = False,
    use_cache: bool = True,
) -> dict[str, list[tuple[int, np.ndarray]]]:
    """{sample token: [(label, coords)]} for every record, computed once (pool) and cached."""
    dataroot = str(Path(dataroot).resolve())
    jobs = [(r["token"], r["map_location"], lidar2global_of(r).tolist()) for r in records]
    maps = [Path(dataroot) / "maps" / "expansion" / f"{loc}.json" for loc in MAP_LOCATIONS]
    key = {"what": "map-geometry-v1", "root": dataroot, "patch": list(patch_size), "merge": merge_dividers,
           "maps": file_fingerprint(maps),
           "samples": __import__("hashlib").sha1("".join(t for t, _, _ in jobs).encode()).hexdigest()}

    def build() -> dict:
        chunks = [jobs[i:i + 16] for i in range(0, len(jobs), 16)]
        args = [(c, dataroot, tuple(patch_size), merge_dividers) for c in chunks]
        if workers > 0 and len(chunks) > 1:
            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
            with ProcessPoolExecutor(min(workers, len(chunks)), mp_context=ctx, **pool_kwargs()) as pool:
                parts = list(pool.map(_extract_chunk, args))
        else:
            parts = [_extract_chunk(a) for a in args]
        return {tok: insts for part in parts for tok, insts in part}

    return cached(cache_dir, "nuscenes-map-geometry", key, build, use_cache=use_cache)
