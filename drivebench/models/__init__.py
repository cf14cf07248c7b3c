"""Pure-PyTorch perception models, one package per architecture, registered by name."""

from drivebench.models.registry import ModelSpec, create_model, get_spec, list_models, register_model

__all__ = ["ModelSpec", "create_model", "get_spec", "list_models", "register_model"]
