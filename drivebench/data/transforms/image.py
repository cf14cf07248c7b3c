"""Image-space transforms that keep ``lidar2img`` and the intrinsics in step with the pixels.

Every geometric step left-multiplies the image matrices by the same 3x3 pixel transform A:
``cam_intrinsic <- A @ K`` and ``lidar2img <- A4 @ lidar2img`` (A4 = A padded to 4x4), and folds A
into ``img_aug_matrix``, so a device-side warp can redo the pixels later.
"""

from __future__ import annotations

import math

import cv2
import numpy as np


def _fold(results: dict, a: np.ndarray) -> None:
    """Apply a (N, 3, 3) or (3, 3) pixel transform to every camera's matrices."""
    n = len(results["lidar2img"])
    a = np.broadcast_to(a, (n, 3, 3))
    a4 = np.tile(np.eye(4), (n, 1, 1))
    a4[:, :3, :3] = a
    results["lidar2img"] = a4 @ results["lidar2img"]
    results["cam_intrinsic"] = a @ results["cam_intrinsic"]
    results["img_aug_matrix"] = a @ results.get("img_aug_matrix", np.tile(np.eye(3), (n, 1, 1)))


class NormalizeMultiView:
    """mmcv.imnormalize on each view: BGR -> RGB (``to_rgb``), subtract mean, divide by std."""

    def __init__(self, mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375), to_rgb: bool = True) -> None:
        self.mean = np.array(mean, np.float64).reshape(1, -1)
        self.stdinv = 1 / np.array(std, np.float64).reshape(1, -1)
        self.to_rgb = to_rgb

    def __call__(self, results: dict) -> dict:
        out = []
        for img in results["img"]:
            img = img.astype(np.float32)  # copies, as mmcv does
            if self.to_rgb:
                cv2.cvtColor(img, cv2.COLOR_BGR2RGB, img)
            cv2.subtract(img, self.mean, img)
            cv2.multiply(img, self.stdinv, img)
            out.append(img)
        results["img"] = out
        results["img_norm_cfg"] = {"mean": self.mean.ravel(), "std": 1 / self.stdinv.ravel(), "to_rgb": self.to_rgb}
        return results


class RandomScaleMultiView:
    """MapTR's RandomScaleImageMultiViewImage: one scale from ``scales`` (rng), bilinear resize.

    ``resize_images=False`` only updates the matrices and shapes (the device resizes later).
    """

    def __init__(self, scales=(0.5,), resize_images: bool = True) -> None:
        self.scales = list(scales)
        self.resize_images = resize_images

    def __call__(self, results: dict) -> dict:
        s = self.scales[int(results["rng"].integers(len(self.scales)))] if len(self.scales) > 1 else self.scales[0]
        shapes = results["img_shape"]
        new = [(int(h * s), int(w * s)) for h, w in shapes]
        if self.resize_images and "img" in results:
            results["img"] = [cv2.resize(img, (w, h), interpolation=cv2.INTER_LINEAR)
                              for img, (h, w) in zip(results["img"], new)]
        a = np.diag([s, s, 1.0])
        _fold(results, a)
        results["img_shape"] = new
        results["scale_factor"] = s
        return results


class PadMultiView:
    """Zero-pad bottom/right to a multiple of ``size_divisor`` (mmcv.impad_to_multiple)."""

    def __init__(self, size_divisor: int = 32, pad_val: float = 0.0) -> None:
        self.size_divisor = size_divisor
        self.pad_val = pad_val

    def __call__(self, results: dict) -> dict:
        d = self.size_divisor
        out = []
        for img in results["img"]:
            h, w = img.shape[:2]
            ph, pw = int(math.ceil(h / d)) * d, int(math.ceil(w / d)) * d
            if (ph, pw) != (h, w):
                img = cv2.copyMakeBorder(img, 0, ph - h, 0, pw - w, cv2.BORDER_CONSTANT, value=[self.pad_val] * 3)
            out.append(img)
        results["img"] = out
        results["pad_shape"] = [im.shape[:2] for im in out]
        return results


class ResizeCropFlipRotate:
    """SparseDrive / GaussianFormer image augmentation: resize, crop, horizontal flip, rotate.

    Parameters are drawn as upstream ``get_augmentation`` / ``_sample_augmentation`` draw them
    (train) or set to the centred test values (``train=False``); from ``results["seq_rng"]`` when
    ``per_sequence`` (SparseDrive keeps one augmentation per sequence), else ``results["rng"]``.
    Pixels: an area-averaging resize then one affine warp (upstream uses PIL resize/crop/flip/
    rotate: the same geometry, a slightly different filter). ``warp_images=False`` only updates
    matrices and shapes, for a device-side warp.
    """

    def __init__(
        self,
        final_dim: tuple[int, int] = (256, 704),
        resize_lim: tuple[float, float] = (0.40, 0.47),
        bot_pct_lim: tuple[float, float] = (0.0, 0.0),
        rot_lim: tuple[float, float] = (-5.4, 5.4),
        rand_flip: bool = True,
        train: bool = True,
        per_sequence: bool = False,
        warp_images: bool = True,
    ) -> None:
        self.final_dim = tuple(final_dim)
        self.resize_lim = tuple(resize_lim)
        self.bot_pct_lim = tuple(bot_pct_lim)
        self.rot_lim = tuple(rot_lim)
        self.rand_flip = rand_flip
        self.train = train
        self.per_sequence = per_sequence
        self.warp_images = warp_images

    def sample(self, rng: np.random.Generator, h: int, w: int) -> dict:
        fh, fw = self.final_dim
        if self.train:
            resize = float(rng.uniform(*self.resize_lim))
            new_w, new_h = int(w * resize), int(h * resize)
            crop_h = int((1 - rng.uniform(*self.bot_pct_lim)) * new_h) - fh
            crop_w = int(rng.uniform(0, max(0, new_w - fw)))
            flip = bool(self.rand_flip and rng.integers(2))
            rotate = float(rng.uniform(*self.rot_lim))
        else:
            resize = max(fh / h, fw / w)
            new_w, new_h = int(w * resize), int(h * resize)
            crop_h = int((1 - np.mean(self.bot_pct_lim)) * new_h) - fh
            crop_w = int(max(0, new_w - fw) / 2)
            flip, rotate = False, 0.0
        return {"resize": resize, "resize_dims": (new_w, new_h), "crop": (crop_w, crop_h, crop_w + fw, crop_h + fh),
                "flip": flip, "rotate": rotate}

    @staticmethod
    def matrix(aug: dict) -> np.ndarray:
        """The 3x3 pixel transform of upstream ``_img_transform`` (resize, crop, flip, rotate)."""
        resize = aug["resize"]
        x0, y0, x1, y1 = aug["crop"]
        m = np.eye(3)
        m[:2, :2] *= resize
        m[:2, 2] -= (x0, y0)
        if aug["flip"]:
            m = np.array([[-1.0, 0.0, x1 - x0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]) @ m
        r = math.radians(aug["rotate"])
        rot = np.array([[math.cos(r), math.sin(r), 0.0], [-math.sin(r), math.cos(r), 0.0], [0.0, 0.0, 1.0]])
        centre = np.array([x1 - x0, y1 - y0]) / 2
        rot[:2, 2] = -rot[:2, :2] @ centre + centre
        return rot @ m

    def __call__(self, results: dict) -> dict:
        rng = results["seq_rng"] if self.per_sequence else results["rng"]
        h, w = results["img_shape"][0]
        aug = self.sample(rng, h, w)
        a = self.matrix(aug)
        fh, fw = self.final_dim
        if self.warp_images and "img" in results:
            out = []
            nw, nh = aug["resize_dims"]
            # after the resize, the remaining crop / flip / rotation in resized pixels
            rest = a @ np.diag([1 / aug["resize"], 1 / aug["resize"], 1.0])
            rest[:2, :2] = np.round(rest[:2, :2], 12)
            for img in results["img"]:
                if (nw, nh) != (img.shape[1], img.shape[0]):
                    img = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_AREA)
                out.append(self._warp(img, rest, aug, fw, fh))
            results["img"] = out
        _fold(results, a)
        results["img_shape"] = [(fh, fw)] * len(results["img_shape"])
        results["aug_config"] = aug
        return results

    @staticmethod
    def _warp(img: np.ndarray, rest: np.ndarray, aug: dict, fw: int, fh: int) -> np.ndarray:
        x0, y0, _, _ = aug["crop"]
        if aug["rotate"] == 0.0 and 0 <= x0 and 0 <= y0 and y0 + fh <= img.shape[0] and x0 + fw <= img.shape[1]:
            out = img[y0:y0 + fh, x0:x0 + fw]  # pure crop (and flip): slicing, no resampling
            return np.ascontiguousarray(out[:, ::-1] if aug["flip"] else out)
        return cv2.warpAffine(img, rest[:2], (fw, fh), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT,
                              borderValue=0)
