"""OmegaConf resolvers used by drivebench/conf (registered on import of ``drivebench``).

``${on_gpu:A,B}`` is A on a machine with a CUDA GPU and B otherwise. The model configs use it for
their default size: the paper size on GPUs, the CPU test size (``test``, for every model) on
CPU-only machines (QCNet at paper size needs about a minute per step on 2 cores). An explicit
``model.size=...`` always wins.

``${pick:TABLE,KEY}`` is the entry of mapping TABLE named by the value of config key KEY (as
text), e.g. SparseDrive's ``recipe: ${pick:${model.recipes},model.stage}`` (upstream's stage-1 or
stage-2 recipe by ``model.stage``); another value is a ConfigError naming KEY and the choices.
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


def _pick(table: Any, key: str, _root_: Any) -> Any:
    from drivebench.errors import bad_choice

    value = OmegaConf.select(_root_, key)
    if str(value) not in table:
        raise bad_choice(key, value, list(table))
    return table[str(value)]


def register() -> None:
    if not OmegaConf.has_resolver("on_gpu"):
        OmegaConf.register_new_resolver("on_gpu", _on_gpu)
    if not OmegaConf.has_resolver("pick"):
        OmegaConf.register_new_resolver("pick", _pick)
