"""The multi-camera pipeline of a nuScenes model, assembled from its recipe and the accel knobs.

One object per model config (``model.transform``) says which recipe (MapTR / SparseDrive /
GaussianFormer, in ``drivebench.data.transforms.recipes``) the model trains on; the data source
calls :meth:`CameraPipeline.build` per split with the resolved accel knobs:

* ``precompute_targets``: augmentation-independent map ground truth computed once for every
  sample (process pool of ``preprocess_workers``, cached on disk) instead of per sample;
* ``shm_cache``: every camera image of the split decoded once (same pool) into one shared-memory
  block that all loader workers read (skipped when JPEG decode moves to the device);
* ``device_transform``: ``images`` leaves photometric distortion / normalisation (/ scale, pad) to
  the device, ``decode`` also the JPEG decode (nvjpeg) and the resize/crop warp.

:meth:`device_transform_for` gives the batch-level transform the datamodule runs after the
host-to-device copy (``drivebench.data.device_transfer``).
"""

from __future__ import annotations

import inspect
import logging
import time
from pathlib import Path
from typing import Any, Callable

import cv2
import numpy as np
from omegaconf import DictConfig, OmegaConf

from drivebench.accel.settings import AccelSettings
from drivebench.accel.shm_cache import CacheDoesNotFit, SharedArrayCache
from drivebench.data.nuscenes import CAMERAS
from drivebench.data.transforms import recipes

log = logging.getLogger(__name__)

PAPER_WIDTH = 1600  # nuScenes camera width that upstream recipes are written for


def _maptr_sizes(options: dict[str, Any], source_width: int, pipeline_fn: Callable[..., list]) -> dict[str, Any]:
    """MapTR scales the whole image: ``out_width`` (800 for tiny = 0.5 x 1600) -> the scale factor."""
    out = dict(options)
    if "out_width" in out:
        out["scale"] = out.pop("out_width") / source_width
    return out


def _crop_sizes(options: dict[str, Any], source_width: int, pipeline_fn: Callable[..., list]) -> dict[str, Any]:
    """A crop recipe's resize range is written for 1600-px sources and for the recipe's own output width
    (SparseDrive 0.40-0.47 for 704 px, GaussianFormer 1.0 for 1600): rescale it for other source widths and
    for other ``final_dim`` widths, so that the crop keeps the recipe's field of view. Scaled for the source
    alone, a 176-px test output cropped a 176x64 patch from the bottom of a 704-px image while validation
    (``train=False``: fit the output) saw the whole view."""
    params = inspect.signature(pipeline_fn).parameters
    recipe_final_dim = tuple(params["final_dim"].default)
    out = dict(options)
    out["final_dim"] = tuple(out.get("final_dim", recipe_final_dim))
    factor = PAPER_WIDTH / source_width * out["final_dim"][1] / recipe_final_dim[1]
    out["resize_lim"] = tuple(v * factor for v in out.get("resize_lim", params["resize_lim"].default))
    return out


def _same_device_scale(options: dict[str, Any], device_options: dict[str, Any]) -> dict[str, Any]:
    out = dict(device_options)
    if "scale" in options:
        out["scale"] = options["scale"]
    if "final_dim" in options:
        out["final_dim"] = tuple(options["final_dim"])
    return out


_RECIPES: dict[str, tuple[Callable[..., list], Callable[..., Any], bool, Callable[..., dict]]] = {
    # name: (pipeline factory, device-transform factory, needs map ground truth, size adapter)
    "maptr": (recipes.maptr_pipeline, recipes.maptr_device_transform, True, _maptr_sizes),
    "sparsedrive": (recipes.sparsedrive_pipeline, recipes.sparsedrive_device_transform, True, _crop_sizes),
    "gaussianformer": (recipes.gaussianformer_pipeline, recipes.gaussianformer_device_transform, False, _crop_sizes),
}


def _plain(options: Any) -> dict[str, Any]:
    if options is None:
        return {}
    if isinstance(options, DictConfig):
        return OmegaConf.to_container(options, resolve=True)  # type: ignore[return-value]
    return dict(options)


def _decode_rgb(path: str) -> np.ndarray | None:
    """A camera image for the shared-memory cache; None for one that does not decode: the cache leaves it
    out, and the loader, reading it itself, applies ``data.on_corrupt`` to it with the file named."""
    return cv2.imread(path, cv2.IMREAD_COLOR)


class CameraPipeline:
    """Args:
        recipe: maptr | sparsedrive | gaussianformer.
        options: extra keyword arguments of the recipe (e.g. ``final_dim``, ``scale``).
        device_options: extra keyword arguments of the device transform.
    """

    def __init__(self, recipe: str, options: dict[str, Any] | None = None,
                 device_options: dict[str, Any] | None = None) -> None:
        if recipe not in _RECIPES:
            raise ValueError(f"camera recipe {recipe!r} is unknown; valid: {', '.join(_RECIPES)}")
        self.recipe = recipe
        self.options = _plain(options)
        self.device_options = _plain(device_options)
        self.stats: dict[str, Any] = {}
        self.image_cache: SharedArrayCache | None = None
        self._shared_image_cache: SharedArrayCache | None = None  # see share_image_cache

    # ---- per split ---------------------------------------------------------------------------
    def build(self, records: list[dict], root: Path, accel: AccelSettings, cache_dir: Path, train: bool,
              progress: bool = True) -> list:
        pipeline_fn, _, needs_map, adapt = _RECIPES[self.recipe]
        source_width = int(records[0]["images"][CAMERAS[0]].get("width", PAPER_WIDTH))
        kwargs: dict[str, Any] = adapt(self.options, source_width, pipeline_fn)
        self._resolved = kwargs.copy()
        if "train" in inspect.signature(pipeline_fn).parameters:
            kwargs["train"] = train
        if needs_map and accel.precompute_targets:
            from drivebench.data.transforms.map_gt import precompute_map_geometry

            t0 = time.perf_counter()
            kwargs["map_geometry"] = precompute_map_geometry(records, root, workers=accel.preprocess_workers,
                                                             cache_dir=cache_dir)
            self.stats["map_gt_precompute_s"] = time.perf_counter() - t0
        decode_on_device = accel.device_transform == "decode"
        kwargs["device_decode"] = decode_on_device
        kwargs["device_images"] = accel.device_transform == "images"
        if accel.shm_cache and train:
            if decode_on_device:
                self.stats["image_cache"] = {"enabled": False, "reason": "JPEG decode runs on the device"}
            else:
                kwargs["image_cache"] = self._image_cache(records, root, accel, progress)
        return pipeline_fn(root, **kwargs)

    def share_image_cache(self, cache: SharedArrayCache | None) -> None:
        """Use ``cache`` (another build's decoded images) instead of decoding again when it holds exactly
        this split's files: accel=auto's candidates are separate builds of the same data, and decoding the
        bench set's images took each MapTR candidate ~20-30 s of trial on the H200."""
        self._shared_image_cache = cache

    def _image_cache(self, records: list[dict], root: Path, accel: AccelSettings, progress: bool) -> Any:
        paths = sorted({str(root / r["images"][cam]["img_path"]) for r in records for cam in CAMERAS})
        shared = self._shared_image_cache
        if shared is not None and shared.keys == tuple(paths):
            self.image_cache = shared
            return shared
        try:
            cache = SharedArrayCache(paths, _decode_rgb, accel.shm_cache_max_gb * 2**30,
                                     workers=accel.preprocess_workers, progress=progress, desc="shm image cache")
        except CacheDoesNotFit as err:
            log.warning("image cache disabled: %s", err)
            self.stats["image_cache"] = {"enabled": False, "reason": str(err)}
            return None
        self.image_cache = cache
        return cache

    def cache_stats(self) -> dict[str, Any]:
        if self.image_cache is not None:
            return {"enabled": True, **self.image_cache.stats().to_dict()}
        return self.stats.get("image_cache", {"enabled": False})

    # ---- on the device -----------------------------------------------------------------------
    def device_transform_for(self, accel: AccelSettings) -> Callable[[dict], dict] | None:
        """The batch transform for the device, built on first use (after :meth:`build` has seen the
        source image size)."""
        if accel.device_transform == "off":
            return None
        return _DeviceTransform(self, accel)

    def make_device_transform(self, accel: AccelSettings) -> Callable[[dict], dict]:
        _, device_fn, _, _ = _RECIPES[self.recipe]
        kwargs = _same_device_scale(getattr(self, "_resolved", {}), self.device_options)
        params = inspect.signature(device_fn).parameters
        kwargs = {k: v for k, v in kwargs.items() if k in params}
        if "device_decode" in params:
            kwargs["device_decode"] = accel.device_transform == "decode"
        return device_fn(**kwargs)


class _DeviceTransform:
    """Deferred construction of the recipe's device transform (see ``device_transform_for``)."""

    def __init__(self, pipeline: CameraPipeline, accel: AccelSettings) -> None:
        self.pipeline = pipeline
        self.accel = accel
        self._fn: Callable[[dict], dict] | None = None

    @property
    def compiles(self) -> bool:
        """With ``accel.compile``, the per-pixel chain is compiled (see ``DeviceImageTransform.compile``)."""
        return self.accel.compile

    def __call__(self, batch: dict) -> dict:
        if self._fn is None:
            fn = self.pipeline.make_device_transform(self.accel)
            if self.compiles and hasattr(fn, "compile"):
                fn.compile()  # elementwise work: the default mode fuses it; autotuning has nothing to pick
            self._fn = fn
        return self._fn(batch)
