"""OmegaConf resolvers used by conf/ (registered on import of ``drivebench``).

``${on_gpu:A,B}`` is A on a machine with a CUDA GPU and B otherwise. The model configs use it for
their default size: the paper size on GPUs, the CPU test size (``test``, for every model) on
CPU-only machines (QCNet at paper size needs about a minute per step on 2 cores). An explicit
``model.size=...`` always wins.
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import OmegaConf


def _on_gpu(gpu_value: Any, cpu_value: Any) -> Any:
    if os.environ.get("DRIVEBENCH_FORCE_CPU") == "1":
        return cpu_value
    import torch

    return gpu_value if torch.cuda.is_available() else cpu_value


def register() -> None:
    if not OmegaConf.has_resolver("on_gpu"):
        OmegaConf.register_new_resolver("on_gpu", _on_gpu)
