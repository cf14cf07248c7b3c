"""QCNet (Zhou et al., "Query-Centric Trajectory Prediction", CVPR 2023) as a plain nn.Module."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Mapping

import torch
from torch import nn

from drivebench.models.qcnet.agent_encoder import AgentEncoder
from drivebench.models.qcnet.batch import GraphSettings
from drivebench.models.qcnet.decoder import Decoder
from drivebench.models.qcnet.layers import AttentionLayer, FourierEmbedding, TrajectoryGRU
from drivebench.models.qcnet.map_encoder import MapEncoder


COMPILE_SCOPES = ("none", "layers", "layers_gru", "net")


class QCNet(nn.Module):
    """Map encoder -> agent encoder -> two-stage decoder, on a batch from ``collate_qcnet``.

    ``forward`` reads only tensors of the batch (graphs were built on the CPU), has no host syncs
    and no per-scene Python loops. ``transform_kwargs`` holds the graph settings the batch must be
    built with (``QCNetTransform(**net.transform_kwargs)``).
    """

    def __init__(
        self,
        hidden_dim: int = 128,
        num_heads: int = 8,
        head_dim: int = 16,
        num_freq_bands: int = 64,
        num_map_layers: int = 1,
        num_agent_layers: int = 2,
        num_dec_layers: int = 2,
        num_recurrent_steps: int = 3,
        dropout: float = 0.1,
        output_dim: int = 2,
        compile_scope: str = "none",
        output_heads_fp32: bool = True,
        **graph_settings: Any,
    ) -> None:
        super().__init__()
        if compile_scope not in COMPILE_SCOPES:
            raise ValueError(f"compile_scope={compile_scope!r} is not valid; choose one of: {', '.join(COMPILE_SCOPES)}")
        self.compile_scope = compile_scope
        self.graph_settings = GraphSettings(**graph_settings)
        g = self.graph_settings
        common = dict(hidden_dim=hidden_dim, num_freq_bands=num_freq_bands, num_heads=num_heads, head_dim=head_dim,
                      dropout=dropout)
        self.map_encoder = MapEncoder(num_layers=num_map_layers, **common)
        self.agent_encoder = AgentEncoder(num_historical_steps=g.num_historical_steps, num_layers=num_agent_layers,
                                          **common)
        self.decoder = Decoder(output_dim=output_dim, num_historical_steps=g.num_historical_steps,
                               num_future_steps=g.num_future_steps, num_modes=g.num_modes,
                               num_recurrent_steps=num_recurrent_steps, num_layers=num_dec_layers,
                               output_heads_fp32=output_heads_fp32, **common)

    @property
    def transform_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the matching ``QCNetTransform``."""
        return asdict(self.graph_settings)

    #: scenes differ in agents, polygons and edges: the compiled layers see other sizes from batch to batch
    #: (bucketed under CUDA graphs), so ``accel.compile_shape_profile=auto`` keeps Dynamo's shape profile
    compiled_shapes_vary_with_data = True

    def compile_units(self) -> dict[str, nn.Module]:
        """What ``accel.compile`` compiles.

        ``none`` (the class default): nothing. The net traces as one graph without breaks (tests), but
        Inductor needs many minutes to compile the whole graph (over 15 on a 2-core CPU).
        ``layers`` (the config's default): every attention layer and Fourier embedding on its own;
        instances of the same shape share compiled code (34 units -> 15 graphs for ``test``, about
        2 minutes of compilation on 2 CPU cores, no CPU speed-up). On an H200 inside the CUDA graphs
        it fuses the per-edge elementwise chains: step 0.060 s against 0.136 s eager, after ~3.5 min
        of compilation (experiments/results/h200-2026-12-02-b28).
        ``layers_gru``: ``layers`` and the decoder's trajectory GRU, which then runs its recurrence unrolled into
        plain ops that Inductor fuses, instead of cuDNN's kernel (one H100, b53: cuDNN's float32 GRU is 10.5% of a
        ``max`` step's kernel time, 5.7 ms, its backward's elementwise kernel alone 3.9 ms). On that H100 (b54)
        the unrolled form steps 2.8% faster, inside the runs' spread, with four graphs more to compile.
        ``net``: the whole net as one unit (one graph, no breaks): Inductor fuses the elementwise
        chains of every layer; with ``accel.cuda_graphs`` the padded shapes make it compile once
        for static and once for dynamic shapes.
        """
        if self.compile_scope == "none":
            return {}
        if self.compile_scope == "net":
            return {"net": self}
        kinds = (AttentionLayer, FourierEmbedding) + ((TrajectoryGRU,) if self.compile_scope == "layers_gru" else ())
        return {name: module for name, module in self.named_modules() if isinstance(module, kinds)}

    def forward(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        x_pl = self.map_encoder(batch)
        x_a = self.agent_encoder(batch, x_pl)
        return self.decoder(batch, x_pl, x_a)
