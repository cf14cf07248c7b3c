"""Image work on the device: JPEG decode (nvjpeg through torchvision on CUDA), photometric
distortion, normalisation, resize and padding of (B, N, 3, H, W) batches.

Equivalence with the CPU path: the photometric step replays the same per-view parameters
(``photometric_params``, drawn on the CPU from the sample's rng) with the formulas of OpenCV's
float32 BGR<->HSV conversion, so for the same uint8 input the normalised output matches the
CPU path (cv2 + mmcv.imnormalize) to max |error| < 1e-3 (tested; the differences are float32
rounding-order effects). Channel order on the device is BGR, as cv2 decodes; JPEG decode
output (RGB) is flipped to BGR so both paths share one code path.

No host syncs: every on/off flag is applied arithmetically (``torch.where``), never branched on.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

FLT_EPSILON = 1.1920928955078125e-07
# OpenCV HSV->RGB sector table: which of (v, p, q, t) goes to (b, g, r)
_SECTOR = ((1, 3, 0), (1, 0, 2), (3, 0, 1), (0, 2, 1), (0, 1, 3), (2, 1, 0))
_CONSTS: dict = {}


def _const(values, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Small constant tensors, copied to each device once (a host-to-device copy per call would
    block the stream). Inside a compiled graph the tensor is the graph's own constant: the table's
    lookup would make dynamo guard on the table's keys, and the graph that filled it missed its own
    guard at the next call and compiled again (3.2 s of every GaussianFormer ``max`` run, H100)."""
    if torch.compiler.is_compiling():
        return torch.tensor(values, dtype=dtype, device=device)
    key = (values, str(device), dtype)
    if key not in _CONSTS:
        _CONSTS[key] = torch.tensor(values, dtype=dtype, device=device)
    return _CONSTS[key]


def bgr_to_hsv(x: torch.Tensor) -> torch.Tensor:
    """(..., 3, H, W) float BGR -> HSV with H in [0, 360), as cv2.cvtColor(float32, COLOR_BGR2HSV)."""
    b, g, r = x.unbind(-3)
    v = torch.maximum(torch.maximum(b, g), r)
    vmin = torch.minimum(torch.minimum(b, g), r)
    diff = v - vmin
    s = diff / (v.abs() + FLT_EPSILON)
    d = 60.0 / (diff + FLT_EPSILON)
    h = torch.where(v == r, (g - b) * d, torch.where(v == g, (b - r) * d + 120.0, (r - g) * d + 240.0))
    h = torch.where(h < 0, h + 360.0, h)
    return torch.stack([h, s, v], dim=-3)


def hsv_to_bgr(x: torch.Tensor) -> torch.Tensor:
    """Inverse of ``bgr_to_hsv``, as cv2.cvtColor(float32, COLOR_HSV2BGR)."""
    h, s, v = x.unbind(-3)
    h6 = h * (6.0 / 360.0)
    h6 = h6 - 6.0 * torch.floor(h6 / 6.0)
    sector = torch.floor(h6)
    f = h6 - sector
    bad = (sector < 0) | (sector >= 6)
    sector = torch.where(bad, torch.zeros_like(sector), sector).long()
    f = torch.where(bad, torch.zeros_like(f), f)
    tab = torch.stack([v, v * (1.0 - s), v * (1.0 - s * f), v * (1.0 - s + s * f)], dim=-3)  # (..., 4, H, W)
    idx = _const(_SECTOR, x.device, torch.long)[sector]  # (..., H, W, 3)
    idx = idx.movedim(-1, -3)  # (..., 3, H, W)
    return torch.gather(tab, -3, idx)


def photometric(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """(B, N, 3, H, W) float32 BGR in [0, 255] with (B, N, 13) parameters (see transforms.photometric)."""
    p = params.to(device=x.device, dtype=x.dtype)[..., None, None, None]  # (B, N, 13, 1, 1, 1)
    on = lambda k: p[:, :, k] != 0  # noqa: E731
    x = torch.where(on(0), x + p[:, :, 1], x)
    contrast_first = (p[:, :, 2] == 1) & on(3)
    x = torch.where(contrast_first, x * p[:, :, 4], x)
    hsv = bgr_to_hsv(x)
    hch, sch, vch = hsv.unbind(-3)
    sch = torch.where(on(5)[..., 0, :, :], sch * p[:, :, 6, 0], sch)
    hue = torch.where(on(7)[..., 0, :, :], hch + p[:, :, 8, 0], hch)
    hue = torch.where(hue > 360, hue - 360, hue)
    hue = torch.where(hue < 0, hue + 360, hue)
    x = hsv_to_bgr(torch.stack([hue, sch, vch], dim=-3))
    contrast_last = (p[:, :, 2] == 0) & on(3)
    x = torch.where(contrast_last, x * p[:, :, 4], x)
    perm = params[..., 10:13].to(device=x.device).long()  # (B, N, 3)
    swapped = torch.gather(x, 2, perm[..., None, None].expand_as(x))
    return torch.where(on(9), swapped, x)


def normalize(x: torch.Tensor, mean, std, to_rgb: bool = True) -> torch.Tensor:
    """mmcv.imnormalize on (..., 3, H, W) BGR: optional BGR->RGB, minus mean, times 1/std."""
    if to_rgb:
        x = x.flip(-3)
    mean_t = _const(tuple(float(m) for m in mean), x.device, x.dtype).view(3, 1, 1)
    stdinv = _const(tuple(1.0 / float(v) for v in std), x.device, x.dtype).view(3, 1, 1)
    return (x - mean_t) * stdinv


_DECODE_STREAMS: dict[int, torch.cuda.Stream] = {}
# what a run's summary records of its device decode (``settings.device_decode``): runs without it decoded on
# the GPU into blocks that queued kernels could still read (the report warns of each)
DEVICE_DECODE = {"outputs": "a decode stream of their own (since 2026-12-06)"}


def _nvjpeg_decode(flat: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """torchvision's batched nvJPEG decode, with its outputs taken from a stream of their own.

    torchvision allocates the outputs on the caller's current stream and decodes on a private stream
    that does not wait for the caller's: the caching allocator may hand it a block that kernels still
    queued on the training stream will read (a tensor of the last step, freed on that stream), and
    nvJPEG overwrites it first (pytorch/vision PR 9606; a device-side assert in GaussianFormer's
    validation loss on an H100, experiments/results/h100-2026-12-06-b47). Allocated under a decode
    stream, the outputs come from that stream's blocks only; ``record_stream`` keeps each one from
    being handed out again until the work queued on the current stream at its free has run. No host sync.
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    index = device.index if device.index is not None else torch.cuda.current_device()
    consumer = torch.cuda.current_stream(index)
    stream = _DECODE_STREAMS.get(index)
    if stream is None:
        stream = _DECODE_STREAMS[index] = torch.cuda.Stream(index)
    with torch.cuda.stream(stream):
        decoded = decode_jpeg(flat, mode=ImageReadMode.RGB, device=device)  # ready on `stream` at return
    consumer.wait_stream(stream)
    for image in decoded:
        image.record_stream(consumer)
    return decoded


def decode_jpeg_batch(jpegs: list[list[torch.Tensor]], device: torch.device | str) -> torch.Tensor:
    """B lists of N JPEG byte tensors -> (B, N, 3, H, W) uint8 BGR; batched nvjpeg on CUDA."""
    from torchvision.io import ImageReadMode, decode_jpeg

    # decode_jpeg reads its input on the CPU: keep img_jpeg out of the host-to-device batch transfer
    # (a CUDA copy here would be moved back, a sync per tensor)
    flat = [(t if t.device.type == "cpu" else t.cpu()).to(torch.uint8) for views in jpegs for t in views]
    device = torch.device(device)
    decoded = _nvjpeg_decode(flat, device) if device.type == "cuda" else [
        decode_jpeg(t, mode=ImageReadMode.RGB) for t in flat]
    shapes = {tuple(d.shape) for d in decoded}
    if len(shapes) > 1:
        raise ValueError(f"JPEGs of one batch decode to different sizes {sorted(shapes)}; device decode needs one size")
    x = torch.stack(decoded).flip(-3)  # RGB -> BGR
    return x.view(len(jpegs), len(jpegs[0]), *x.shape[1:])


def warp_affine(x: torch.Tensor, matrices: torch.Tensor, out_hw: tuple[int, int]) -> torch.Tensor:
    """Resample (B, N, C, H, W) so output pixel p shows input pixel A^-1 p (A: (B, N, 3, 3) pixel
    transforms, as ``img_aug_matrix``); bilinear, zeros outside. Pixel centres at integer coords."""
    b, n, c, h, w = x.shape
    oh, ow = out_hw
    # inv_ex: no singularity check, which would read a flag back from the device (a host sync)
    inv = torch.linalg.inv_ex(matrices.to(device=x.device, dtype=torch.float32))[0].view(b * n, 3, 3)
    ys, xs = torch.meshgrid(torch.arange(oh, device=x.device, dtype=torch.float32),
                            torch.arange(ow, device=x.device, dtype=torch.float32), indexing="ij")
    pix = torch.stack([xs, ys, torch.ones_like(xs)], -1).view(1, -1, 3)
    src = pix @ inv.transpose(1, 2)  # (BN, P, 3)
    gx = src[..., 0] / (w - 1) * 2 - 1 if w > 1 else src[..., 0] * 0
    gy = src[..., 1] / (h - 1) * 2 - 1 if h > 1 else src[..., 1] * 0
    grid = torch.stack([gx, gy], -1).view(b * n, oh, ow, 2)
    out = F.grid_sample(x.reshape(b * n, c, h, w).float(), grid, mode="bilinear", padding_mode="zeros",
                        align_corners=True)
    return out.view(b, n, c, oh, ow)


class DeviceImageTransform:
    """Batch-level image pipeline for the device; reads ``img_jpeg`` or ``img_uint8`` and writes ``img``.

    Order (faithful to the CPU recipes): decode -> [warp] -> photometric -> normalise -> [scale] ->
    [pad]. ``scale_before_photometric`` moves the resize right after decode: cheaper, but not the
    upstream order (the photometric step is non-linear), so it changes the math slightly.
    The warp (``warp_to``, for device-side resize/crop/flip/rotate) samples bilinearly from the full
    image: same geometry as the CPU path, but no area averaging when it shrinks (more aliasing).
    """

    def __init__(
        self,
        mean=(123.675, 116.28, 103.53),
        std=(58.395, 57.12, 57.375),
        to_rgb: bool = True,
        photometric: bool = True,
        scale: float | None = None,
        pad_divisor: int | None = None,
        warp_to: tuple[int, int] | None = None,
        scale_before_photometric: bool = False,
    ) -> None:
        self.mean, self.std, self.to_rgb = tuple(mean), tuple(std), to_rgb
        self.photometric = photometric
        self.scale = scale
        self.pad_divisor = pad_divisor
        self.warp_to = tuple(warp_to) if warp_to else None
        self.scale_before_photometric = scale_before_photometric
        self._pixels = self._pixels_eager
        self.compiled = False

    def _scale(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c, h, w = x.shape
        oh, ow = int(h * self.scale), int(w * self.scale)
        y = F.interpolate(x.reshape(b * n, c, h, w), size=(oh, ow), mode="bilinear", align_corners=False)
        return y.view(b, n, c, oh, ow)

    def compile(self, mode: str = "default") -> None:
        """Compile the per-pixel chain (float conversion, photometric, normalise, scale, pad) into
        a few fused kernels. Why: eagerly it is ~40 full-resolution passes over the batch (MapTR:
        24 images of 1600x900, ~10 ms of GPU time and ~7 ms of kernel launches per step) where the
        arithmetic needs one read of the uint8 pixels and one write of the result."""
        self._pixels = torch.compile(self._pixels_eager, mode=mode, dynamic=False)
        self.compiled = True

    def _pixels_eager(self, x: torch.Tensor, params: torch.Tensor | None) -> torch.Tensor:
        x = x.float()
        if self.scale is not None and self.scale_before_photometric:
            x = self._scale(x)
        if self.photometric:
            x = photometric(x, params)
        x = normalize(x, self.mean, self.std, self.to_rgb)
        if self.scale is not None and not self.scale_before_photometric:
            x = self._scale(x)
        if self.pad_divisor:
            d = self.pad_divisor
            h, w = x.shape[-2:]
            x = F.pad(x, (0, math.ceil(w / d) * d - w, 0, math.ceil(h / d) * d - h))
        return x.contiguous()

    def __call__(self, batch: dict, device: torch.device | str | None = None) -> dict:
        if "img_jpeg" in batch:
            dev = device or (batch["lidar2img"].device if "lidar2img" in batch else "cpu")
            raw = decode_jpeg_batch(batch.pop("img_jpeg"), dev)
        elif "img_uint8" in batch:
            raw = batch.pop("img_uint8")
            if device is not None:
                raw = raw.to(device, non_blocking=True)
        else:
            raise KeyError("DeviceImageTransform needs img_jpeg or img_uint8 in the batch")
        x = raw
        if self.warp_to is not None:
            x = warp_affine(raw.float(), batch.pop("img_aug_matrix"), self.warp_to)
        params = batch.pop("photometric_params", None)
        if self.photometric:
            if params is None:
                raise KeyError("photometric_params missing: keep PhotoMetricDistortionMultiView(apply=False) in the "
                               "CPU pipeline so the parameters are drawn per sample")
            params = params.to(device=x.device, non_blocking=True)
        batch["img"] = self._pixels(x, params if self.photometric else None)
        return batch
