"""mmdet3d configs: a name or a path -> an mmengine ``Config`` with drivebench's size preset and the
user's overrides applied.

Why one loader: the drivebench model, its dataset and mmengine's runner must see the same config,
so each asks :func:`load_config` (cached per argument set; every caller gets its own copy).
``python -m drivebench.openmmlab.configs [PATTERN]`` lists the configs mmdet3d ships.
"""

from __future__ import annotations

import copy
import difflib
import functools
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any, Mapping

from drivebench.errors import ConfigError
from drivebench.openmmlab import INSTALL_COMMAND, require
from drivebench.openmmlab.presets import PRESETS


def configs_root() -> Path:
    """``mmdet3d/.mim/configs`` of the installed mmdet3d (found without importing it)."""
    spec = importlib.util.find_spec("mmdet3d")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"mmdet3d is not installed, so its configs cannot be found; run `{INSTALL_COMMAND}`")
    root = Path(next(iter(spec.submodule_search_locations))) / ".mim" / "configs"
    if not root.is_dir():
        raise ConfigError(f"mmdet3d at {root.parents[1]} has no packaged configs (.mim/configs); reinstall it "
                          f"with `{INSTALL_COMMAND}` or pass model.config=/path/to/config.py")
    return root


def list_configs(pattern: str = "") -> list[str]:
    """Names (file stems) of mmdet3d's packaged configs containing ``pattern``, base files excluded."""
    root = configs_root()
    names = {p.stem for p in root.rglob("*.py") if "_base_" not in p.relative_to(root).parts}
    return sorted(n for n in names if pattern.lower() in n.lower())


def resolve_config(name: str) -> Path:
    """A path to a ``.py`` config, or a bare name looked up in mmdet3d's packaged configs."""
    text = str(name).strip()
    if not text or text in ("???", "None", "null"):
        raise ConfigError("model.config is not set; give an mmdet3d config name (e.g. "
                          "pointpillars_hv_fpn_sbn-all_8xb4-2x_nus-3d) or a path to a config .py")
    path = Path(text).expanduser()
    if text.endswith(".py") or "/" in text:
        if path.is_file():
            return path.resolve()
        raise ConfigError(f"model.config={text!r}: no such file")
    root = configs_root()
    hits = sorted(p for p in root.rglob(f"{text}.py") if "_base_" not in p.relative_to(root).parts)
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        raise ConfigError(f"model.config={text!r} is ambiguous: {', '.join(str(h.relative_to(root)) for h in hits)}; "
                          "give the path")
    names = list_configs()
    close = close_matches(text, names)
    hint = f"close matches: {', '.join(close)}" if close else \
        "list them with `python -m drivebench.openmmlab.configs [PATTERN]`"
    raise ConfigError(f"model.config={text!r} is not an mmdet3d config ({len(names)} packaged); {hint}")


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[_\-.]", name.lower()) if t]


def close_matches(query: str, names: list[str], n: int = 5) -> list[str]:
    """Names sharing the most words with ``query``, each word allowed a typo (``pointpilars_nus``
    finds the PointPillars nuScenes configs); ties by overall similarity."""
    words = _tokens(query)

    def score(name: str) -> tuple[int, float]:
        tokens = _tokens(name)
        hits = sum(1 for w in words if any(difflib.SequenceMatcher(None, w, t).ratio() >= 0.8 for t in tokens))
        return hits, difflib.SequenceMatcher(None, query.lower(), name.lower()).ratio()

    scored = sorted(((score(name), name) for name in names), key=lambda x: x[0], reverse=True)
    best = scored[0][0][0] if scored else 0
    return [name for (hits, _), name in scored[:n] if hits == best and hits > 0]


def _plain(value: Any) -> Any:
    """OmegaConf containers -> plain dicts/lists (Hydra hands the builder DictConfig values)."""
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(value):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    return value


@functools.lru_cache(maxsize=8)
def _load(path: str, preset: str, options_json: str) -> Any:
    from mmengine.config import Config

    cfg = Config.fromfile(path)
    applied = PRESETS[preset](cfg)
    if applied:
        cfg.merge_from_dict(applied, allow_list_keys=True)
    options = json.loads(options_json)
    if options:
        try:
            cfg.merge_from_dict(options, allow_list_keys=True)
        except (KeyError, IndexError, TypeError) as err:
            raise ConfigError(f"model.cfg_options: {err}") from err
    cfg["_drivebench"] = {"config_path": path, "preset": preset, "preset_options": applied, "cfg_options": options}
    return cfg


def load_config(config: str, preset: str = "config", cfg_options: Mapping[str, Any] | None = None) -> Any:
    """The mmengine Config of ``config`` at size ``preset``, then ``cfg_options`` (mmengine's
    ``--cfg-options`` form: dotted keys, list indices allowed) on top. Returns a private copy."""
    require()
    if preset not in PRESETS:
        raise ConfigError(f"model.size={preset!r} is not a size of model 'mmdet3d'; valid choices: "
                          f"{', '.join(sorted(PRESETS))}")
    options = _plain(cfg_options) or {}
    if not isinstance(options, dict):
        raise ConfigError(f"model.cfg_options={options!r} is not a mapping of dotted keys to values")
    path = str(resolve_config(str(config)))
    return copy.deepcopy(_load(path, preset, json.dumps(options, sort_keys=True, default=str)))


def main(argv: list[str] | None = None) -> int:
    """``python -m drivebench.openmmlab.configs [PATTERN]``: packaged config names, one a line."""
    args = sys.argv[1:] if argv is None else argv
    try:
        names = list_configs(args[0] if args else "")
    except ConfigError as err:
        print(f"drivebench: error: {err}", file=sys.stderr)
        return 2
    print("\n".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
