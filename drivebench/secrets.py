"""Keep credentials (fsspec storage options, tokens) out of everything a run writes.

Anything under a key named ``storage_options``, and any value whose key looks like a credential
(secret, token, password, key...), is replaced by ``***`` in the summary, the command line it
records, and the config files Hydra saves in the run directory.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REDACTED = "***"
_SECRET_KEY = re.compile(r"(secret|token|passw|credential|api[_-]?key|access[_-]?key|private|auth|^key$)", re.I)
_CONTAINER = "storage_options"


def _is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(str(key)))


def redact(obj: Any, inside_options: bool = False) -> Any:
    """A copy of a nested dict/list with credential values replaced by ``***``."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            under = inside_options or str(k) == _CONTAINER
            if under and not isinstance(v, (dict, list)) and str(k) != _CONTAINER:
                out[k] = REDACTED if v is not None else None
            elif _is_secret_key(k) and not isinstance(v, (dict, list)) and v is not None:
                out[k] = REDACTED
            else:
                out[k] = redact(v, under)
        return out
    if isinstance(obj, list):
        return [redact(v, inside_options) for v in obj]
    return obj


_OVERRIDE = re.compile(r"^(?P<key>[+~]{0,2}[\w.@/-]+)=(?P<value>.*)$")


def redact_override(text: str) -> str:
    """``ckpt.storage_options.secret=abc`` -> ``ckpt.storage_options.secret=***``."""
    match = _OVERRIDE.match(text)
    if not match:
        return text
    key = match.group("key")
    parts = key.lstrip("+~").split(".")
    if _CONTAINER in parts[:-1] or (parts and parts[-1] == _CONTAINER) or _is_secret_key(parts[-1]):
        return f"{key}={REDACTED}"
    return text


def redact_argv(argv: list[str]) -> list[str]:
    return [redact_override(a) for a in argv]


def scrub_hydra_dir(run_dir: Path) -> list[Path]:
    """Rewrite ``<run_dir>/.hydra/*.yaml`` with credentials redacted; returns the files changed."""
    changed = []
    hydra_dir = run_dir / ".hydra"
    if not hydra_dir.is_dir():
        return changed
    for path in sorted(hydra_dir.glob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, list):
            clean: Any = [redact_override(x) if isinstance(x, str) else x for x in data]
        else:
            clean = redact(data)
            if isinstance(clean, dict) and isinstance(clean.get("hydra"), dict):
                overrides = clean["hydra"].get("overrides", {})
                for group in ("task", "hydra"):
                    if isinstance(overrides.get(group), list):
                        overrides[group] = [redact_override(x) for x in overrides[group]]
                job = clean["hydra"].get("job", {})
                if isinstance(job.get("override_dirname"), str):
                    job["override_dirname"] = ",".join(redact_override(x) for x in job["override_dirname"].split(","))
        if clean != data:
            path.write_text(yaml.safe_dump(clean, sort_keys=False))
            changed.append(path)
    return changed
