"""The model registry: packages found without a hand list, one CPU test size name, deprecated sizes."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import drivebench.models
from drivebench.app import validate
from drivebench.models import registry
from drivebench.models.registry import get_spec, list_models

CONF = Path(__file__).resolve().parents[1] / "drivebench" / "conf"
MODELS = ["gaussianformer", "maptr", "mmdet3d", "qcnet", "sparsedrive"]


def test_every_model_package_is_found_and_has_the_test_size():
    assert list_models() == MODELS
    for name in MODELS:
        assert "test" in get_spec(name).sizes, name


def test_a_new_model_package_registers_itself_without_edits_elsewhere(tmp_path, monkeypatch):
    package = tmp_path / "toymodel"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from torch import nn\n"
        "from drivebench.models.registry import register_model\n\n\n"
        "@register_model('toymodel', sizes={'test': {'width': 2}}, default_size='test')\n"
        "def build(width):\n"
        "    return nn.Linear(width, width)\n")
    monkeypatch.setattr(drivebench.models, "__path__", [*drivebench.models.__path__, str(tmp_path)])
    monkeypatch.delitem(registry._REGISTRY, "toymodel", raising=False)
    try:
        assert "toymodel" in list_models()
        assert registry.create_model("toymodel").in_features == 2
    finally:
        registry._REGISTRY.pop("toymodel", None)
        sys.modules.pop("drivebench.models.toymodel", None)


@pytest.mark.parametrize("name", ["qcnet", "mmdet3d"])
def test_tiny_is_a_deprecated_alias_of_test_with_one_warning(name, monkeypatch):
    monkeypatch.setattr(registry, "_WARNED", set())
    spec = get_spec(name)
    with pytest.warns(FutureWarning, match=f"model.size=tiny of model '{name}' is deprecated.*model.size=test"):
        assert spec.resolve_size("tiny") == "test"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second use is silent
        assert spec.kwargs_for("tiny") == spec.kwargs_for("test")
    assert "tiny" not in spec.sizes


def test_tiny_stays_upstream_s_own_size_where_it_is_one_and_is_refused_elsewhere():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert get_spec("maptr").resolve_size("tiny") == "tiny"  # MapTR's upstream GPU size
    with pytest.raises(ValueError, match="model.size='tiny' is not a size of model 'sparsedrive'; valid choices: "
                                         "small, test"):
        get_spec("sparsedrive").resolve_size("tiny")


def test_a_run_given_the_old_name_records_the_new_one(monkeypatch):
    monkeypatch.setattr(registry, "_WARNED", set())
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["model=qcnet", "model.size=tiny"])
    with pytest.warns(FutureWarning):
        validate(cfg)
    assert cfg.model.size == "test" and cfg.model.net.size == "test" and cfg.model.transform.size == "test"
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["model=mmdet3d", "model.size=tiny"])
    with pytest.warns(FutureWarning):
        validate(cfg)
    assert cfg.data.source.preset == "test"
