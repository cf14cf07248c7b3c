"""The OpenMMLab bridge: train an mmdetection3d config under drivebench's harness, or under mmengine's
own runner for a side-by-side measurement.

Why a bridge and not a port: perception teams already have their models in mmdetection3d. Here the
model, its dataset and its transforms come from mmdet3d's registries, unchanged; drivebench adds
its loader knobs, precision, DDP, checkpoints and step clock around them (``model=mmdet3d``), and
``bench=mmengine`` runs the same config with mmengine's Runner so the two can be compared.

Modules: :mod:`.install` (builds the mmcv wheel once and installs the stack), :mod:`.configs`
(config names, size presets, overrides), :mod:`.data` (mmdet3d's dataset on drivebench's nuScenes
set), :mod:`.module` (the LightningModule), :mod:`.bench` (mmengine's runner, timed).
Nothing here imports an OpenMMLab package at import time: drivebench runs without them.
"""

from __future__ import annotations

import importlib
import importlib.util

from drivebench.errors import ConfigError

MMCV_VERSION = "2.1.0"  # mmdet3d 1.4.0 wants mmcv>=2.0.0rc4,<2.2.0
MMDET_VERSION = "3.3.0"
MMDET3D_VERSION = "1.4.0"
INSTALL_COMMAND = "python -m drivebench.openmmlab.install"  # also scripts/install_openmmlab.sh


def missing_packages() -> list[str]:
    """Which parts of the OpenMMLab stack are absent or unusable here (empty when all import)."""
    missing = [name for name in ("mmengine", "mmcv", "mmdet", "mmdet3d") if importlib.util.find_spec(name) is None]
    if "mmcv" not in missing:
        try:
            importlib.import_module("mmcv._ext")
        except Exception as err:  # mmcv-lite (no ops), or ops built against another torch
            missing.append(f"mmcv compiled ops ({type(err).__name__}: {str(err)[:120]})")
    return missing


def require(what: str = "model=mmdet3d") -> None:
    """Raise one ConfigError naming the install command when the stack is not usable."""
    missing = missing_packages()
    if missing:
        raise ConfigError(f"{what} needs the OpenMMLab stack (mmcv {MMCV_VERSION} with compiled ops, mmdet "
                          f"{MMDET_VERSION}, mmdet3d {MMDET3D_VERSION}); missing: {', '.join(missing)}. Install "
                          f"it with `{INSTALL_COMMAND}` (builds mmcv once, about 2.5 min on 2 idle cores; cached)")


UPSTREAM_NOISE = (  # warnings mmdet/mmdet3d raise on every step, about their own code
    r"torch\.meshgrid: in an upcoming release",
    r"DeprecationWarning: pos_bboxes is deprecated",
    r"dir_offset and dir_limit_offset will be depressed",
)


def register_mmdet3d() -> None:
    """mmdet3d's registries, with ``mmdet3d`` as the default scope (as its tools/train.py does).
    Its INFO logging (a class table per dataset built) is lowered to warnings: drivebench's summary
    records the data; mmengine's runner (bench=mmengine) keeps its own logger and log file."""
    require()
    import logging
    import warnings

    from mmdet3d.utils import register_all_modules
    from mmengine.logging import MMLogger

    register_all_modules(init_default_scope=True)
    from drivebench.openmmlab.amp import patch_float32_only

    patch_float32_only()  # bf16 autocast reaches code written for float32/float16 only
    logger = MMLogger.get_current_instance()
    logger.setLevel(logging.WARNING)
    for handler in list(logger.handlers):  # a finished mmengine Runner's log file (multirun: an earlier job)
        if isinstance(handler, logging.FileHandler):
            handler.close()
            logger.removeHandler(handler)
    for pattern in UPSTREAM_NOISE:
        warnings.filterwarnings("ignore", message=pattern)
