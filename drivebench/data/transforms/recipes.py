"""Per-model pipeline recipes: plain lists of transforms in upstream order, with the accel knobs.

Knobs (all default to the faithful upstream behaviour):
- ``map_geometry``: a precomputed {token: instances} mapping (``precompute_map_geometry``) instead
  of map-API + shapely work per sample.
- ``image_cache``: consulted before each JPEG decode (``get(path)``; filled through ``put``).
- ``device_images``: decode on the CPU but leave photometric distortion, normalisation (and for
  MapTR the 0.5 scale and padding) to ``*_device_transform`` on the accelerator.
- ``device_decode``: ship JPEG bytes; the device decodes (nvjpeg) and does all image work,
  including the resize/crop/flip/rotate warp of SparseDrive and GaussianFormer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from drivebench.data.transforms.collate import FormatCameraSample
from drivebench.data.transforms.depth import LidarDepthMaps
from drivebench.data.transforms.device import DeviceImageTransform
from drivebench.data.transforms.image import NormalizeMultiView, PadMultiView, RandomScaleMultiView, ResizeCropFlipRotate
from drivebench.data.transforms.loading import (ImageCache, LoadMultiViewImages, LoadOccupancy, LoadPoints,
                                                RegridOccupancy)
from drivebench.data.transforms.map_gt import MapGeometry, MapGeometryExtractor, VectorizeMap
from drivebench.data.transforms.photometric import PhotoMetricDistortionMultiView
from drivebench.data.transforms.targets import BoxTargets, EgoTargets

IMG_NORM = {"mean": (123.675, 116.28, 103.53), "std": (58.395, 57.12, 57.375), "to_rgb": True}


class ToFloat32:
    """uint8 views -> float32 copies (upstream's resize/crop transforms return float32)."""

    def __call__(self, results: dict) -> dict:
        results["img"] = [img.astype(np.float32) for img in results["img"]]
        return results


def _load(image_cache: ImageCache | None, device_decode: bool, to_float32: bool) -> LoadMultiViewImages:
    if device_decode:
        return LoadMultiViewImages(mode="bytes")
    return LoadMultiViewImages(to_float32=to_float32, image_cache=image_cache)


def _map_steps(dataroot: str | Path, map_geometry: dict | None, ordering: str, merge_dividers: bool) -> list:
    source = map_geometry if map_geometry is not None else MapGeometryExtractor(dataroot, merge_dividers=merge_dividers)
    return [MapGeometry(source), VectorizeMap(ordering)]


def maptr_pipeline(
    dataroot: str | Path,
    *,
    map_geometry: dict | None = None,
    image_cache: ImageCache | None = None,
    device_images: bool = False,
    device_decode: bool = False,
    scale: float = 0.5,
    size_divisor: int = 32,
    merge_dividers: bool = False,
    img_norm: dict = IMG_NORM,
) -> list:
    """MapTR v1 train pipeline: decode, photometric at full resolution, normalise, scale 0.5, pad
    to 32, vectorised map GT per sample. (Upstream also loads and filters 3D boxes it then
    overwrites with map GT; that wasted work is left out.)"""
    on_device = device_images or device_decode
    steps = [_load(image_cache, device_decode, to_float32=not on_device),
             PhotoMetricDistortionMultiView(apply=not on_device)]
    if not on_device:
        steps.append(NormalizeMultiView(**img_norm))
    steps.append(RandomScaleMultiView([scale], resize_images=not on_device))
    if not on_device:
        steps.append(PadMultiView(size_divisor))
    steps += _map_steps(dataroot, map_geometry, "maptr_v2", merge_dividers)
    steps.append(FormatCameraSample())
    return steps


def maptr_device_transform(scale: float = 0.5, size_divisor: int = 32, img_norm: dict = IMG_NORM) -> DeviceImageTransform:
    return DeviceImageTransform(**img_norm, photometric=True, scale=scale, pad_divisor=size_divisor)


def sparsedrive_pipeline(
    dataroot: str | Path,
    *,
    map_geometry: dict | None = None,
    image_cache: ImageCache | None = None,
    device_images: bool = False,
    device_decode: bool = False,
    final_dim: tuple[int, int] = (256, 704),
    resize_lim: tuple[float, float] = (0.40, 0.47),
    rot_lim: tuple[float, float] = (-5.4, 5.4),
    rand_flip: bool = True,
    depth_strides: tuple[int, ...] = (4, 8, 16),
    train: bool = True,
    per_sequence_aug: bool = True,
    merge_dividers: bool = False,
    img_norm: dict = IMG_NORM,
) -> list:
    """SparseDrive-S stage-1/2 train pipeline: decode, points, resize/crop/flip/rotate to 704x256,
    depth maps at strides 4/8/16, photometric at the low resolution, normalise, box / motion /
    planning targets, vectorised map GT (SparseDrive's 38 permutations)."""
    on_device = device_images or device_decode
    steps = [_load(image_cache, device_decode, to_float32=False), LoadPoints(),
             ResizeCropFlipRotate(final_dim, resize_lim, (0.0, 0.0), rot_lim, rand_flip, train=train,
                                  per_sequence=per_sequence_aug, warp_images=not device_decode),
             LidarDepthMaps(depth_strides)]
    if on_device:
        steps.append(PhotoMetricDistortionMultiView(apply=False))
    else:
        steps += [ToFloat32(), PhotoMetricDistortionMultiView(), NormalizeMultiView(**img_norm)]
    steps += [BoxTargets(), EgoTargets()]
    steps += _map_steps(dataroot, map_geometry, "permute", merge_dividers)
    steps.append(FormatCameraSample(device_warp=device_decode))
    return steps


def sparsedrive_device_transform(final_dim: tuple[int, int] = (256, 704), device_decode: bool = False,
                                 img_norm: dict = IMG_NORM) -> DeviceImageTransform:
    return DeviceImageTransform(**img_norm, photometric=True, warp_to=final_dim if device_decode else None)


def gaussianformer_pipeline(
    dataroot: str | Path,
    *,
    image_cache: ImageCache | None = None,
    device_images: bool = False,
    device_decode: bool = False,
    final_dim: tuple[int, int] = (864, 1600),
    resize_lim: tuple[float, float] = (1.0, 1.0),
    rand_flip: bool = True,
    train: bool = True,
    img_norm: dict = IMG_NORM,
    occ_grid: dict | None = None,
) -> list:
    """GaussianFormer (nuscenes_gs144000) train pipeline: decode, occupancy (dense 200x200x16),
    crop to 1600x864 at full resolution (``resize_lim`` 1.0 of a 1600-px source; CameraPipeline rescales it for
    other source and output widths) with random flip, photometric and normalise at full size.
    ``occ_grid`` ({lower, shape, voxel}) coarsens the labels to a smaller model grid (test sizes)."""
    on_device = device_images or device_decode
    steps = [_load(image_cache, device_decode, to_float32=False), LoadOccupancy()]
    if occ_grid:
        steps.append(RegridOccupancy(tuple(occ_grid["lower"]), tuple(occ_grid["shape"]), float(occ_grid["voxel"])))
    steps.append(ResizeCropFlipRotate(final_dim, resize_lim, (0.0, 0.0), (0.0, 0.0), rand_flip, train=train,
                                      warp_images=not device_decode))
    if on_device:
        steps.append(PhotoMetricDistortionMultiView(apply=False))
    else:
        steps += [ToFloat32(), PhotoMetricDistortionMultiView(), NormalizeMultiView(**img_norm)]
    steps.append(FormatCameraSample(device_warp=device_decode))
    return steps


def gaussianformer_device_transform(final_dim: tuple[int, int] = (864, 1600), device_decode: bool = False,
                                    img_norm: dict = IMG_NORM) -> DeviceImageTransform:
    return DeviceImageTransform(**img_norm, photometric=True, warp_to=final_dim if device_decode else None)
