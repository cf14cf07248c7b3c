"""QCNet in plain PyTorch, registered as ``qcnet`` with sizes ``paper`` (upstream AV2 settings) and ``test``
(the CPU test size; ``tiny``, its old name, is still accepted with a deprecation warning).

Graphs are built on the CPU by :class:`QCNetTransform` (per scene, in the DataLoader workers) and
batched by :func:`collate_qcnet`; build the transform that matches a model with
:func:`make_transform` (same size name) or ``QCNetTransform(**net.transform_kwargs)``.
"""

from __future__ import annotations

from typing import Any

from drivebench.models.qcnet.batch import GraphSettings, QCNetTransform, collate_qcnet
from drivebench.models.qcnet.loss import QCNetLoss
from drivebench.models.qcnet.model import QCNet
from drivebench.models.registry import get_spec, register_model

# Upstream's README command for AV2: radii pl2pl 150, pl2a 50, a2a 50, pl2m 150, a2m 150; time span 10;
# 30 history steps seen by the decoder; 3 recurrent steps; script defaults for the rest.
_GRAPH = dict(num_historical_steps=50, num_future_steps=60, num_modes=6, time_span=10, pl2pl_radius=150.0,
              pl2a_radius=50.0, a2a_radius=50.0, num_t2m_steps=30, pl2m_radius=150.0, a2m_radius=150.0)
SIZES: dict[str, dict[str, Any]] = {
    "paper": dict(hidden_dim=128, num_heads=8, head_dim=16, num_freq_bands=64, num_map_layers=1,
                  num_agent_layers=2, num_dec_layers=2, num_recurrent_steps=3, dropout=0.1, **_GRAPH),
    "test": dict(hidden_dim=32, num_heads=2, head_dim=16, num_freq_bands=8, num_map_layers=1,
                 num_agent_layers=2, num_dec_layers=2, num_recurrent_steps=3, dropout=0.1, **_GRAPH),
}


@register_model("qcnet", sizes=SIZES, default_size="paper", deprecated_sizes={"tiny": "test"},
                task="motion_forecasting", dataset="argoverse2")
def build_qcnet(**kwargs: Any) -> QCNet:
    """Build QCNet; graph settings (radii, steps, modes) go to ``net.transform_kwargs``."""
    return QCNet(**kwargs)


def make_transform(size: str | None = None, **overrides: Any) -> QCNetTransform:
    """The ``QCNetTransform`` matching ``create_model("qcnet", size, **overrides)``."""
    kwargs = get_spec("qcnet").kwargs_for(size)
    kwargs.update(overrides)
    graph_fields = GraphSettings.__dataclass_fields__
    return QCNetTransform(**{k: v for k, v in kwargs.items() if k in graph_fields})


__all__ = ["QCNet", "QCNetLoss", "QCNetTransform", "SIZES", "build_qcnet", "collate_qcnet", "make_transform"]
