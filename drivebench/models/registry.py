"""A small model registry (timm-style): architectures register a builder plus named sizes.

Why: configs name a model and a size (``model=qcnet model.size=tiny``); nothing else in the code
branches on model names. Packages under ``drivebench.models.<name>`` are imported lazily the first
time their name is asked for, so adding a model needs no edits elsewhere.
"""

from __future__ import annotations

import fnmatch
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    """What the registry knows about one architecture."""

    name: str
    builder: Callable[..., nn.Module]
    sizes: dict[str, dict[str, Any]]
    default_size: str
    meta: dict[str, Any] = field(default_factory=dict)

    def kwargs_for(self, size: str | None) -> dict[str, Any]:
        size = size or self.default_size
        if size not in self.sizes:
            raise ValueError(
                f"model.size={size!r} is not a size of model {self.name!r}; "
                f"valid choices: {', '.join(sorted(self.sizes))}"
            )
        return dict(self.sizes[size])


_REGISTRY: dict[str, ModelSpec] = {}


def register_model(
    name: str, *, sizes: dict[str, dict[str, Any]], default_size: str, **meta: Any
) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator: ``@register_model("qcnet", sizes={...}, default_size="paper")`` on a builder."""
    if default_size not in sizes:
        raise ValueError(f"default_size {default_size!r} not among sizes of {name!r}")

    def wrap(builder: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        _REGISTRY[name] = ModelSpec(name, builder, sizes, default_size, meta)
        return builder

    return wrap


def _ensure_imported(name: str) -> None:
    if name in _REGISTRY:
        return
    try:
        importlib.import_module(f"drivebench.models.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"drivebench.models.{name}":
            raise
    if name not in _REGISTRY:
        raise ValueError(f"model={name!r} is not a registered model; valid choices: {', '.join(list_models())}")


def get_spec(name: str) -> ModelSpec:
    _ensure_imported(name)
    return _REGISTRY[name]


def create_model(name: str, size: str | None = None, **overrides: Any) -> nn.Module:
    """Build ``name`` at ``size`` (the registered default when None); ``overrides`` win over the size."""
    spec = get_spec(name)
    kwargs = spec.kwargs_for(size)
    kwargs.update(overrides)
    return spec.builder(**kwargs)


_KNOWN_PACKAGES = ("qcnet", "maptr", "sparsedrive", "gaussianformer", "mmdet3d")


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching a glob (imports the known model packages first)."""
    for pkg in _KNOWN_PACKAGES:
        try:
            importlib.import_module(f"drivebench.models.{pkg}")
        except ModuleNotFoundError as err:
            if err.name != f"drivebench.models.{pkg}":
                raise
    return sorted(n for n in _REGISTRY if fnmatch.fnmatch(n, pattern))
