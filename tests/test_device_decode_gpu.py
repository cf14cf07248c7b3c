"""The device JPEG decode must not write into memory that queued kernels still read (CUDA only).

torchvision's nvJPEG decode takes its outputs from the caller's stream and writes them from a stream
that does not wait for it (pytorch/vision PR 9606): a block freed while kernels queued on the
training stream still read it could be overwritten first. GaussianFormer's validation loss hit a
device-side assert from it at ``accel=max`` (experiments/results/h100-2026-12-06-b47). The check is
deterministic: tensors of known content are freed while a long kernel holds back the reductions that
read them, then a decode asks for blocks of their size; a reduction that saw decoded pixels is wrong.
"""

from __future__ import annotations

import pytest
import torch

from drivebench.data.transforms import device

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

HEIGHT, WIDTH, IMAGES = 448, 800, 6


def _jpeg() -> torch.Tensor:
    from torchvision.io import encode_jpeg

    g = torch.Generator().manual_seed(0)
    return encode_jpeg(torch.randint(0, 256, (3, HEIGHT, WIDTH), dtype=torch.uint8, generator=g), quality=90)


def _corrupted_reductions(decode, rounds: int = 20) -> int:
    jpeg, wrong = _jpeg(), 0
    for r in range(rounds):
        values = [(r * IMAGES + i) % 250 + 1 for i in range(IMAGES)]
        tensors = [torch.full((3, HEIGHT, WIDTH), v, dtype=torch.uint8, device="cuda") for v in values]
        torch.cuda.synchronize()
        torch.cuda._sleep(20_000_000)  # ~10 ms of GPU time in front of the reads below
        sums = [t.sum(dtype=torch.int64) for t in tensors]
        del tensors  # freed on the stream whose queued reductions still read them
        decoded = decode([[jpeg] * IMAGES])
        torch.cuda.synchronize()
        expected = [v * 3 * HEIGHT * WIDTH for v in values]
        wrong += sum(int(s) != e for s, e in zip(sums, expected))
        assert decoded.shape == (1, IMAGES, 3, HEIGHT, WIDTH)
    return wrong


def test_decode_leaves_memory_of_queued_reads_alone():
    assert _corrupted_reductions(lambda jpegs: device.decode_jpeg_batch(jpegs, "cuda")) == 0


def torchvision_alone(jpegs: list[list[torch.Tensor]]) -> torch.Tensor:
    """torchvision's decode as drivebench called it before 2026-12-06 (for the script below)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    out = decode_jpeg([t for views in jpegs for t in views], mode=ImageReadMode.RGB, device="cuda")
    return torch.stack(out).flip(-3).view(len(jpegs), len(jpegs[0]), 3, HEIGHT, WIDTH)


if __name__ == "__main__":  # the hazard itself on this GPU: python tests/test_device_decode_gpu.py
    print(f"{torch.cuda.get_device_name()}: reductions corrupted in 20 rounds of {IMAGES}: "
          f"torchvision alone {_corrupted_reductions(torchvision_alone)}, "
          f"drivebench's decode {_corrupted_reductions(lambda j: device.decode_jpeg_batch(j, 'cuda'))}")
