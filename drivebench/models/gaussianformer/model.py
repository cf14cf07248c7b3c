"""GaussianFormer (Huang et al., ECCV 2024): 3D semantic occupancy from 6 cameras through 3D Gaussians.

images -> ResNet+FPN -> N learnable Gaussians -> 4 encoder blocks (deformable aggregation, sparse
conv among Gaussians, refinement) -> Gaussian-to-voxel splatting on the occupancy grid at the
supervised layers. Reads the batch keys of ``docs/batch-contract.md`` (camera models).

Differences from huang-yh/GaussianFormer, their cost and the knobs that restore upstream's step:
``README.md`` in this package. In short: plain PyTorch, no compiled extensions; batches of any size
(upstream asserts 1); the sparse conv and the splatting visit upstream's pairs (one host sync each);
Sigma^-1 in closed form on the device; torchvision's pytorch-style ResNet with DCNv2 through
``torchvision.ops.deform_conv2d``; backbone activation checkpointing as upstream's ``with_cp``.
"""

from __future__ import annotations

from typing import Any, Sequence

from torch import nn

from drivebench.models.common.backbone import NormEval
from drivebench.models.gaussianformer.anchor import AnchorEncoder, AnchorLayout, GaussianLifter
from drivebench.models.gaussianformer.encoder import CameraInputs, EncoderBlockConfig, GaussianEncoderBlock
from drivebench.models.gaussianformer.geometry import GaussianSet, GridSpec
from drivebench.models.gaussianformer.head import GaussianOccupancyHead
from drivebench.models.gaussianformer.image_encoder import build_image_encoder
from drivebench.models.gaussianformer.splat import DEFAULT_CHUNK_PAIRS

LOSS_LAYER_CHOICES = ("all", "last")
COMPILE_SCOPES = ("image_encoder", "encoder")


class GaussianFormer(nn.Module):
    """Build from keyword arguments (the registry's sizes); see ``drivebench/models/gaussianformer/__init__.py``.

    ``forward(batch)`` returns:
        occ_logits: list of (B, C, X, Y, Z) class scores, one per supervised layer (training: every
            layer when ``loss_layers="all"``, the last one for ``"last"``; eval: the last one).
        occ_pred: (B, X, Y, Z) argmax class of the last layer.
        gaussians: list of ``GaussianSet`` per encoder layer.
    """

    def __init__(
        self,
        *,
        depth: str = "resnet101",
        dcn_stages: Sequence[int] = (2, 3),
        width_div: int = 1,
        backbone_weights: str | None = None,
        norm_eval: NormEval = "with_weights",
        embed_dims: int = 128,
        ffn_dims: int = 512,
        num_levels: int = 4,
        num_cams: int = 6,
        num_groups: int = 4,
        num_learnable_points: int = 2,
        num_blocks: int = 4,
        num_gaussians: int = 25600,
        scale_range: Sequence[float] = (0.08, 0.64),
        unit_xyz: Sequence[float] = (4.0, 4.0, 1.0),
        include_opacity: bool = True,
        semantics_activation: str = "softplus",
        with_empty: bool = True,
        empty_mean: Sequence[float] = (0.0, 0.0, -1.0),
        empty_scale: Sequence[float] = (100.0, 100.0, 8.0),
        sparse_voxel_size: float = 0.5,
        sparse_kernel_size: int = 5,
        sparse_out_proj: bool = True,
        sparse_conv: str = "rulebook",
        dropout: float = 0.1,
        attn_drop: float = 0.15,
        aggregation_checkpoint: bool = False,
        aggregation: str = "grid_sample",
        activation_checkpointing: bool = True,
        grid_shape: Sequence[int] = (200, 200, 16),
        grid_lower: Sequence[float] = (-50.0, -50.0, -5.0),
        voxel_size: float = 0.5,
        num_classes: int = 18,
        empty_label: int = 17,
        loss_layers: str = "last",
        splat_chunk_pairs: int = DEFAULT_CHUNK_PAIRS,
        splat_window: str = "radius",
        image_size: Sequence[int] = (864, 1600),
        compile_scope: str = "image_encoder",
    ) -> None:
        super().__init__()
        if loss_layers not in LOSS_LAYER_CHOICES:
            raise ValueError(f"loss_layers={loss_layers!r} is not valid; choose one of: {LOSS_LAYER_CHOICES}")
        if compile_scope not in COMPILE_SCOPES:
            raise ValueError(f"compile_scope={compile_scope!r} is not valid; choose one of: {', '.join(COMPILE_SCOPES)}")
        self.compile_scope = compile_scope
        self.grid = GridSpec(tuple(int(v) for v in grid_shape), tuple(float(v) for v in grid_lower), float(voxel_size))
        self.num_classes = num_classes
        self.empty_label = empty_label
        self.loss_layers = loss_layers
        self.image_size = tuple(int(v) for v in image_size)  # (H, W) the paper config feeds; metadata only
        self.num_cams = num_cams
        semantic_dim = num_classes - int(with_empty)
        self.layout = AnchorLayout(self.grid.lower, self.grid.upper, (float(scale_range[0]), float(scale_range[1])),
                                   include_opacity, semantic_dim, semantics_activation)

        self.image_encoder = build_image_encoder(depth, embed_dims, dcn_stages, width_div, backbone_weights, num_levels,
                                                 activation_checkpointing, norm_eval)
        self.lifter = GaussianLifter(num_gaussians, embed_dims, self.layout)
        self.anchor_encoder = AnchorEncoder(embed_dims, self.layout)
        block_cfg = EncoderBlockConfig(
            embed_dims=embed_dims, ffn_dims=ffn_dims, num_groups=num_groups, num_levels=num_levels,
            num_cams=num_cams, num_learnable_points=num_learnable_points, dropout=dropout, attn_drop=attn_drop,
            unit_xyz=tuple(float(v) for v in unit_xyz), sparse_voxel_size=sparse_voxel_size,
            sparse_kernel_size=sparse_kernel_size, sparse_out_proj=sparse_out_proj,
            sparse_conv=sparse_conv, aggregation_checkpoint=aggregation_checkpoint, aggregation=aggregation,
        )
        self.blocks = nn.ModuleList(
            [GaussianEncoderBlock(block_cfg, self.layout, use_sparse_conv=i > 0) for i in range(num_blocks)]
        )
        self.head = GaussianOccupancyHead(self.grid, num_classes, empty_label, float(scale_range[1]), with_empty,
                                          empty_mean, empty_scale, chunk_pairs=splat_chunk_pairs,
                                          window=splat_window)

    def backbone_input_shape(self, batch_size: int) -> tuple[int, int, int, int]:
        """What the backbone sees per step: every camera image of the batch (sizes the checkpointing choice)."""
        return (batch_size * self.num_cams, 3, *self.image_size)

    def supervised_layers(self) -> list[int]:
        """Encoder layers whose occupancy is predicted in this mode (upstream ``apply_loss_type``)."""
        last = len(self.blocks) - 1
        if self.training and self.loss_layers == "all":
            return list(range(last + 1))
        return [last]

    def encode(self, batch: dict[str, Any]) -> list[GaussianSet]:
        """Run image encoder and Gaussian encoder; returns the decoded Gaussians of every layer."""
        img = batch["img"]
        if img.dim() != 5:
            raise ValueError(f"batch['img'] must be (B, N, 3, H, W), got shape {tuple(img.shape)}")
        b = img.shape[0]
        cams = CameraInputs(self.image_encoder(img), batch["lidar2img"], batch["img_shape"],
                            (img.shape[-2], img.shape[-1]))
        anchor, instance_feature = self.lifter(b)
        anchor_embed = self.anchor_encoder(anchor)
        layers: list[GaussianSet] = []
        for i, block in enumerate(self.blocks):
            instance_feature, anchor = block(instance_feature, anchor, anchor_embed, cams)
            layers.append(self.layout.decode(anchor))
            if i + 1 < len(self.blocks):
                anchor_embed = self.anchor_encoder(anchor)
        return layers

    #: the compiled units see one image size and a fixed number of Gaussians every step
    #: (``accel.compile_shape_profile=auto`` keeps Dynamo's shape profile only where compiled shapes depend on the batch)
    compiled_shapes_vary_with_data = False

    def compile_units(self) -> dict[str, nn.Module]:
        """What ``accel.compile`` compiles.

        ``image_encoder``: the image backbone + FPN (static shapes, most FLOPs).
        ``encoder`` (the config's default): also the anchor encoder and, in every block, the deformable
        aggregation, the FFN and the Gaussian refinement: all on a fixed number of Gaussians, so shapes
        are static. Left eager: the sparse convolution (its voxel neighbourhoods change with the
        Gaussians) and the splatting head (chunks of Gaussian-voxel pairs). On an H100 at ``max`` with the
        compiled aggregation: 0.289 s a step against 0.304 s, for a longer first compile (docs/accel.md).
        """
        units: dict[str, nn.Module] = {"image_encoder": self.image_encoder}
        if self.compile_scope == "encoder":
            units["anchor_encoder"] = self.anchor_encoder
            for i, block in enumerate(self.blocks):
                units.update({f"blocks.{i}.aggregation": block.aggregation, f"blocks.{i}.ffn": block.ffn,
                              f"blocks.{i}.refine": block.refine})
        return units

    def forward(self, batch: dict[str, Any]) -> dict[str, Any]:
        layers = self.encode(batch)
        occ_logits = [self.head(layers[i]) for i in self.supervised_layers()]
        return {"occ_logits": occ_logits, "occ_pred": occ_logits[-1].argmax(dim=1), "gaussians": layers}
