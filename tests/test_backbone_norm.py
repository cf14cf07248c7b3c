"""The image backbone's BatchNorm: frozen (upstream's ``norm_eval=True``) only with pretrained weights.

Frozen statistics of random weights are mean 0, variance 1: a frozen BN is then the identity and the
residual stack runs un-normalised. These tests pin the choice and the failure it avoids."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

from drivebench.models import create_model
from drivebench.models.common.backbone import ResNetBackbone, frozen_norm


def _norms(module: nn.Module) -> set[type]:
    return {type(m) for m in module.modules() if isinstance(m, (nn.BatchNorm2d, FrozenBatchNorm2d))}


@pytest.fixture(scope="module")
def image() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(2, 3, 96, 160)  # a normalised image


def _c5_std(norm_eval, image: torch.Tensor, depth: str = "resnet50") -> float:
    torch.manual_seed(0)
    backbone = ResNetBackbone(depth, out_indices=(3,), frozen_stages=1, norm_eval=norm_eval).train()
    with torch.no_grad():
        return float(backbone(image)[0].std())


def test_from_random_init_the_batchnorm_trains_and_normalises(image):
    """R50 at random init: C5 keeps unit scale with trained BN; frozen (identity) BN lets it grow ~30x."""
    trained, frozen = _c5_std("with_weights", image), _c5_std(True, image)
    assert 0.3 < trained < 3.0, trained
    assert frozen > 10 * trained, (frozen, trained)


def test_with_weights_the_batchnorm_is_frozen_and_keeps_their_statistics(tmp_path, image):
    torch.manual_seed(1)
    net = torchvision.models.resnet18(weights=None)
    with torch.no_grad():
        net.bn1.running_mean.uniform_(-1, 1)
    path = tmp_path / "r18.pth"
    torch.save(net.state_dict(), path)
    backbone = ResNetBackbone("resnet18", out_indices=(3,), norm_eval="with_weights", weights=str(path))
    assert backbone.frozen_norm and _norms(backbone) == {FrozenBatchNorm2d}
    assert torch.equal(backbone.stem[1].running_mean, net.bn1.running_mean)
    assert not ResNetBackbone("resnet18", out_indices=(3,), norm_eval="with_weights").frozen_norm


def test_a_weights_file_that_is_not_this_resnets_state_dict_is_refused_naming_it(tmp_path):
    """strict=False loading would take a file of another network silently (nothing loaded): refused instead."""
    cases = {
        "text.pth": (lambda p: p.write_text("not a checkpoint"), "is not a state_dict torch.load can read"),
        "list.pth": (lambda p: torch.save([1, 2], p), "holds a list, not a state_dict"),
        "other.pth": (lambda p: torch.save({"foo": torch.zeros(3)}, p),
                      "shares no parameter name with a torchvision resnet18"),
        "r34.pth": (lambda p: torch.save(torchvision.models.resnet34(weights=None).state_dict(), p), None),
        "r50.pth": (lambda p: torch.save(torchvision.models.resnet50(weights=None).state_dict(), p),
                    "does not fit a torchvision resnet18: size mismatch"),
    }
    for name, (write, words) in cases.items():
        path = tmp_path / name
        write(path)
        if words is None:  # resnet34's extra blocks are keys resnet18 lacks; its shared ones fit: loaded, as upstream
            ResNetBackbone("resnet18", out_indices=(3,), weights=str(path))
            continue
        with pytest.raises(ValueError, match=f"backbone_weights={path} {words}"):
            ResNetBackbone("resnet18", out_indices=(3,), weights=str(path))


@pytest.mark.parametrize("norm_eval, weights, frozen", [
    (True, None, True), (False, "w.pth", False), ("with_weights", None, False), ("with_weights", "w.pth", True)])
def test_frozen_norm_resolves(norm_eval, weights, frozen):
    assert frozen_norm(norm_eval, weights) is frozen


def test_a_bad_norm_eval_names_the_choices():
    with pytest.raises(ValueError, match="norm_eval='maybe' is not valid; use true .* with_weights"):
        frozen_norm("maybe", None)


@pytest.mark.parametrize("name, size, overrides, norms", [
    ("maptr", "test", {}, {nn.BatchNorm2d}),
    ("maptr", "test", {"norm_eval": True}, {FrozenBatchNorm2d}),
    ("gaussianformer", "test", {}, {nn.BatchNorm2d}),
])
def test_the_models_train_their_batchnorm_from_random_init(name, size, overrides, norms):
    model = create_model(name, size, **overrides)
    assert _norms(model.image_encoder) == norms


def test_the_pre_run_check_of_a_fitting_weights_file_is_silent(tmp_path):
    """The check builds the net on the meta device, where loading weights warns once per tensor (a no-op copy): it
    must not print those (MapTR tiny with a ResNet-50 file: 265 warnings before)."""
    import warnings

    from drivebench.app import check_before_start
    from drivebench.compose import compose

    path = tmp_path / "r50.pth"
    torch.save(torchvision.models.resnet50(weights=None).state_dict(), path)
    cfg = compose(["model=maptr", "model.size=tiny", f"model.net.backbone_weights={path}",
                   f"hydra.run.dir={tmp_path / 'run'}"], return_hydra_config=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_before_start(cfg)
    assert not [w for w in caught if "meta" in str(w.message)], caught[:3]


def test_a_weights_path_under_the_home_directory_loads_as_the_pre_run_check_found_it(tmp_path, monkeypatch):
    """The pre-run check expands ``~``; the build did not, so a path it let through failed after data preparation."""
    monkeypatch.setenv("HOME", str(tmp_path))
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), tmp_path / "r18.pth")
    assert ResNetBackbone("resnet18", out_indices=(3,), weights="~/r18.pth").frozen_norm
