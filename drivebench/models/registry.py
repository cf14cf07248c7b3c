"""A small model registry (timm-style): architectures register a builder plus named sizes.

Why: configs name a model and a size (``model=qcnet model.size=test``); nothing else in the code
branches on model names. Every subpackage of ``drivebench.models`` that calls
:func:`register_model` when imported is a model: :func:`list_models` finds them with ``pkgutil``
and a name is imported the first time it is asked for, so adding a model needs no edits elsewhere.

Every model's CPU test size is called ``test``; upstream's own size names stay as they are. A size
that was renamed stays accepted through ``deprecated_sizes`` (timm's deprecation map): the old name
resolves to the new one with a one-time ``FutureWarning``.
"""

from __future__ import annotations

import fnmatch
import importlib
import pkgutil
import warnings
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
    deprecated_sizes: dict[str, str] = field(default_factory=dict)  # old name -> current name

    def resolve_size(self, size: str | None) -> str:
        """The current name of ``size`` (the default for None); warns once for a deprecated name.

        Raises:
            ValueError: ``size`` is no size of this model (the message lists the valid ones).
        """
        size = size or self.default_size
        if size in self.deprecated_sizes:
            current = self.deprecated_sizes[size]
            if (self.name, size) not in _WARNED:
                _WARNED.add((self.name, size))
                warnings.warn(f"model.size={size} of model {self.name!r} is deprecated and is now called "
                              f"{current!r}; write model.size={current}", FutureWarning, stacklevel=3)
            size = current
        if size not in self.sizes:
            raise ValueError(
                f"model.size={size!r} is not a size of model {self.name!r}; "
                f"valid choices: {', '.join(sorted(self.sizes))}"
            )
        return size

    def kwargs_for(self, size: str | None) -> dict[str, Any]:
        return dict(self.sizes[self.resolve_size(size)])


_REGISTRY: dict[str, ModelSpec] = {}
_WARNED: set[tuple[str, str]] = set()


def register_model(
    name: str, *, sizes: dict[str, dict[str, Any]], default_size: str,
    deprecated_sizes: dict[str, str] | None = None, **meta: Any
) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator: ``@register_model("qcnet", sizes={...}, default_size="paper")`` on a builder.

    ``deprecated_sizes`` maps renamed sizes to their current names (``{"tiny": "test"}``).
    """
    if default_size not in sizes:
        raise ValueError(f"default_size {default_size!r} not among sizes of {name!r}")
    deprecated = dict(deprecated_sizes or {})
    for old, current in deprecated.items():
        if current not in sizes or old in sizes:
            raise ValueError(f"deprecated size {old!r} of {name!r} must map onto a size ({current!r} is not one, "
                             f"or {old!r} still is)")

    def wrap(builder: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        _REGISTRY[name] = ModelSpec(name, builder, sizes, default_size, meta, deprecated)
        return builder

    return wrap


def _import_package(name: str) -> None:
    """Import ``drivebench.models.<name>``; a package that does not exist is not an error."""
    try:
        importlib.import_module(f"{__package__}.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"{__package__}.{name}":
            raise


def get_spec(name: str) -> ModelSpec:
    if name not in _REGISTRY:
        _import_package(name)
    if name not in _REGISTRY:
        raise ValueError(f"model={name!r} is not a registered model; valid choices: {', '.join(list_models())}")
    return _REGISTRY[name]


def create_model(name: str, size: str | None = None, **overrides: Any) -> nn.Module:
    """Build ``name`` at ``size`` (the registered default when None); ``overrides`` win over the size."""
    spec = get_spec(name)
    kwargs = spec.kwargs_for(size)
    kwargs.update(overrides)
    return spec.builder(**kwargs)


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching a glob, after importing every subpackage of drivebench.models
    (those that register are the models; helpers such as ``common`` register nothing)."""
    package = importlib.import_module(__package__)
    for info in pkgutil.iter_modules(package.__path__):
        if info.ispkg:
            _import_package(info.name)
    return sorted(n for n in _REGISTRY if fnmatch.fnmatch(n, pattern))
