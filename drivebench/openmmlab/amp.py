"""bf16 autocast around mmcv ops whose CUDA kernels have no bf16 instantiation.

mmcv 2.1.0 compiles most CUDA ops for float, double and half only (``AT_DISPATCH_FLOATING_TYPES_AND_HALF``),
so under bf16 autocast an op fed by an autocast layer (PointPillars' head -> mmcv's ``sigmoid_focal_loss``
on CUDA) fails with "not implemented for 'BFloat16'". Both runners (drivebench and mmengine's
AmpOptimWrapper with dtype bfloat16) meet it. The fix is the one autocast applies to its own
fp32-only ops: the op's floating inputs go in as float32. It changes nothing outside bf16 (fp32 and
half inputs pass through), and the CPU path of these losses is plain torch, which handles bf16.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable

import torch

# (module, attribute): mmcv ops as the OpenMMLab code that calls them imported them
HALF_ONLY_OPS = (("mmdet.models.losses.focal_loss", "_sigmoid_focal_loss"),)


def float32_for_bf16(op: Callable[..., Any]) -> Callable[..., Any]:
    """``op`` with its bf16 tensor arguments cast to float32 (others unchanged)."""
    if getattr(op, "_drivebench_float32_for_bf16", False):
        return op

    @functools.wraps(op)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        def cast(value: Any) -> Any:
            return value.float() if isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16 else value
        return op(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})

    wrapped._drivebench_float32_for_bf16 = True  # type: ignore[attr-defined]
    return wrapped


def patch_half_only_ops() -> list[str]:
    """Wrap every op in :data:`HALF_ONLY_OPS` that is importable here; returns the wrapped names."""
    patched = []
    for module_name, attr in HALF_ONLY_OPS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if hasattr(module, attr):
            setattr(module, attr, float32_for_bf16(getattr(module, attr)))
            patched.append(f"{module_name}.{attr}")
    return patched
