"""Mixed precision around OpenMMLab code written for float32 or float16 only.

Two kinds of code break under autocast, in both runners (drivebench, and mmengine's AmpOptimWrapper):

* mmcv 2.1.0 compiles most CUDA ops for float, double and half only
  (``AT_DISPATCH_FLOATING_TYPES_AND_HALF``): PointPillars' head feeds a bf16 score into mmcv's
  ``sigmoid_focal_loss`` on CUDA and fails with "not implemented for 'BFloat16'";
* mmdet3d's ``naiveSyncBN1d/2d`` (the "sbn" configs, PointPillars on nuScenes among them) assert a
  float32 input, so a conv that autocast ran in bf16 or fp16 stops the step (seen on the H200 and
  reproduced on the CPU with ``accel.precision=bf16-mixed``).

The fix is the one autocast applies to its own float32-only ops: the floating inputs go in as float32.
Other dtypes pass through unchanged, so nothing changes without autocast.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable

import torch

BF16 = (torch.bfloat16,)
HALF_TYPES = (torch.bfloat16, torch.float16)

# (module, attribute path, dtypes cast to float32) as the OpenMMLab code that calls them sees them
FLOAT32_ONLY = (
    ("mmdet.models.losses.focal_loss", "_sigmoid_focal_loss", BF16),  # mmcv op: float/half kernels
    ("mmdet3d.models.layers.norm", "NaiveSyncBatchNorm1d.forward", HALF_TYPES),  # asserts float32
    ("mmdet3d.models.layers.norm", "NaiveSyncBatchNorm2d.forward", HALF_TYPES),
)


def float32_for(op: Callable[..., Any], dtypes: tuple[torch.dtype, ...] = BF16) -> Callable[..., Any]:
    """``op`` with its tensor arguments of ``dtypes`` cast to float32 (others unchanged)."""
    if getattr(op, "_drivebench_float32_for", None) is not None:
        return op

    @functools.wraps(op)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        def cast(value: Any) -> Any:
            return value.float() if isinstance(value, torch.Tensor) and value.dtype in dtypes else value
        return op(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})

    wrapped._drivebench_float32_for = dtypes  # type: ignore[attr-defined]
    return wrapped


def patch_float32_only() -> list[str]:
    """Wrap every entry of :data:`FLOAT32_ONLY` that is importable here; returns the wrapped names."""
    patched = []
    for module_name, path, dtypes in FLOAT32_ONLY:
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        *parents, attr = path.split(".")
        for name in parents:
            owner = getattr(owner, name, None)
        if owner is not None and hasattr(owner, attr):
            setattr(owner, attr, float32_for(getattr(owner, attr), dtypes))
            patched.append(f"{module_name}.{path}")
    return patched
