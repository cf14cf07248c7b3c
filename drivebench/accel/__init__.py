"""The speed knobs: loader tuning, shared-memory caches, process pools, compile, precision."""

from drivebench.accel.settings import AccelSettings

__all__ = ["AccelSettings"]
