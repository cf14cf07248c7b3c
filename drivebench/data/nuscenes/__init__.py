"""nuScenes data layer: an embedded, format-valid generator, the devkit-based sample index, and errors.

The generator (``generate.ensure_generated``) writes a small dataset in the real nuScenes layout so
that the official devkit reads it unchanged; ``infos.build_infos`` turns any nuScenes root (real or
embedded) into the per-sample index the pipelines in ``drivebench.data.transforms`` consume.
"""

from drivebench.data.nuscenes.errors import DataFileError, MissingTableError

CAMERAS: tuple[str, ...] = (
    "CAM_FRONT",
    "CAM_FRONT_RIGHT",
    "CAM_FRONT_LEFT",
    "CAM_BACK",
    "CAM_BACK_LEFT",
    "CAM_BACK_RIGHT",
)
# the devkit's attribute names, in its order (nuscenes.eval.detection.constants); the batch's
# gt_attr_labels index this, -1 for an annotation without attribute
ATTRIBUTE_NAMES: tuple[str, ...] = (
    "pedestrian.moving",
    "pedestrian.sitting_lying_down",
    "pedestrian.standing",
    "cycle.with_rider",
    "cycle.without_rider",
    "vehicle.moving",
    "vehicle.parked",
    "vehicle.stopped",
)
LOCATIONS: tuple[str, ...] = (
    "boston-seaport",
    "singapore-onenorth",
    "singapore-hollandvillage",
    "singapore-queenstown",
)

__all__ = ["ATTRIBUTE_NAMES", "CAMERAS", "LOCATIONS", "DataFileError", "MissingTableError"]
