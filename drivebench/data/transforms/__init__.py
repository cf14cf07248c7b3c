"""Composable per-sample transforms for the camera models on nuScenes.

Each transform is a small class with ``__call__(results: dict) -> dict``; recipes (``recipes.py``)
list them in upstream order per model, and ``collate`` batches the formatted samples into the keys
of docs/batch-contract.md. ``results`` carries numpy arrays: ``img`` (list of HxWx3, BGR),
``img_shape`` (valid (h, w) per view), ``lidar2img`` (N, 4, 4), ``cam_intrinsic`` (N, 3, 3), the
sample's ``rng`` / ``seq_rng`` and the info-record fields (see ``dataset.record_to_results``).
"""

from drivebench.data.transforms.collate import FormatCameraSample, collate
from drivebench.data.transforms.dataset import NuScenesDataset, record_to_results
from drivebench.data.transforms.depth import LidarDepthMaps
from drivebench.data.transforms.device import DeviceImageTransform
from drivebench.data.transforms.image import NormalizeMultiView, PadMultiView, RandomScaleMultiView, ResizeCropFlipRotate
from drivebench.data.transforms.loading import DictImageCache, LoadMultiViewImages, LoadOccupancy, LoadPoints
from drivebench.data.transforms.map_gt import MapGeometry, MapGeometryExtractor, VectorizeMap, precompute_map_geometry
from drivebench.data.transforms.photometric import PhotoMetricDistortionMultiView
from drivebench.data.transforms.recipes import (
    gaussianformer_device_transform,
    gaussianformer_pipeline,
    maptr_device_transform,
    maptr_pipeline,
    sparsedrive_device_transform,
    sparsedrive_pipeline,
)
from drivebench.data.transforms.targets import BoxTargets, EgoTargets

__all__ = [
    "BoxTargets", "DeviceImageTransform", "DictImageCache", "EgoTargets", "FormatCameraSample", "LidarDepthMaps",
    "LoadMultiViewImages", "LoadOccupancy", "LoadPoints", "MapGeometry", "MapGeometryExtractor", "NormalizeMultiView",
    "NuScenesDataset", "PadMultiView", "PhotoMetricDistortionMultiView", "RandomScaleMultiView",
    "ResizeCropFlipRotate", "VectorizeMap", "collate", "gaussianformer_device_transform", "gaussianformer_pipeline",
    "maptr_device_transform", "maptr_pipeline", "precompute_map_geometry", "record_to_results",
    "sparsedrive_device_transform", "sparsedrive_pipeline",
]
