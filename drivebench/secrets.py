"""Keep credentials (fsspec storage options, tokens) out of everything a run writes.

Three nets, because credentials reach a run three ways:

* by key: anything under a key named ``storage_options``, and any value whose key looks like a
  credential (secret, token, password, key...), is replaced by ``***`` in the summary's config, the
  command line it records, and the config files Hydra saves (``.hydra/*.yaml``, ``multirun.yaml``);
* inside URLs: ``s3://user:password@host/bucket`` keeps its host but loses the user part;
* by value: the known secret values (``ckpt.storage_options``) are cut out of log records and of
  error messages, wherever a library happens to quote them.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Iterable

import yaml

REDACTED = "***"
_SECRET_KEY = re.compile(r"(secret|token|passw|credential|api[_-]?key|access[_-]?key|private|auth|^key$)", re.I)
_CONTAINER = "storage_options"
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][\w+.-]*://)(?P<userinfo>[^/@\s]+)@")
_MIN_SECRET_LEN = 4  # shorter values ("1", "us") are options, not credentials, and would redact noise


def _is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(str(key)))


def redact_url(text: str) -> str:
    """``s3://AKIA:pw@host/b`` -> ``s3://***@host/b`` (every URL inside ``text``)."""
    return _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)


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
    if isinstance(obj, str):
        return redact_url(obj)
    return obj


_OVERRIDE = re.compile(r"^(?P<key>[+~]{0,2}[\w.@/-]+)=(?P<value>.*)$")


def redact_override(text: str) -> str:
    """``ckpt.storage_options.secret=abc`` -> ``ckpt.storage_options.secret=***``."""
    match = _OVERRIDE.match(text)
    if not match:
        return redact_url(text)
    key = match.group("key")
    parts = key.lstrip("+~").split(".")
    if _CONTAINER in parts[:-1] or (parts and parts[-1] == _CONTAINER) or _is_secret_key(parts[-1]):
        return f"{key}={REDACTED}"
    return redact_url(text)


def redact_argv(argv: list[str]) -> list[str]:
    return [redact_override(a) for a in argv]


# ---- by value --------------------------------------------------------------------------------
def secret_values(options: Any) -> list[str]:
    """The credential strings inside a storage_options mapping (nested values included)."""
    found: list[str] = []
    if isinstance(options, dict):
        for v in options.values():
            found.extend(secret_values(v))
    elif isinstance(options, (list, tuple)):
        for v in options:
            found.extend(secret_values(v))
    elif isinstance(options, str) and len(options) >= _MIN_SECRET_LEN:
        found.append(options)
    return found


def redact_text(text: str, values: Iterable[str]) -> str:
    """``text`` with every known secret value and URL credential replaced by ``***``."""
    for value in sorted(set(values), key=len, reverse=True):  # longest first: one may contain another
        text = text.replace(value, REDACTED)
    return redact_url(text)


class RedactingFilter(logging.Filter):
    """A handler filter that rewrites records quoting a known secret value (never drops one)."""

    def __init__(self, values: Iterable[str]) -> None:
        super().__init__("drivebench.secrets")
        self.values = sorted(set(values), key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_text(message, self.values)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def install_log_redaction(values: Iterable[str]) -> RedactingFilter | None:
    """Add a :class:`RedactingFilter` to every handler that exists now (Hydra's console and file
    handlers on the root logger, Lightning's own); returns it, or None when there is nothing to hide."""
    values = [v for v in values if v]
    if not values:
        return None
    flt = RedactingFilter(values)
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    for lg in loggers:
        for handler in lg.handlers:
            if not any(isinstance(f, RedactingFilter) and f.values == flt.values for f in handler.filters):
                handler.addFilter(flt)
    return flt


# ---- files Hydra wrote -----------------------------------------------------------------------
def _scrub_yaml(path: Path) -> bool:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return False
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
    if clean == data:
        return False
    path.write_text(yaml.safe_dump(clean, sort_keys=False))
    return True


def scrub_hydra_dir(run_dir: Path) -> list[Path]:
    """Rewrite ``<run_dir>/.hydra/*.yaml`` (and a sweep's ``multirun.yaml`` one level up) with
    credentials redacted; returns the files changed."""
    candidates = sorted((run_dir / ".hydra").glob("*.yaml")) if (run_dir / ".hydra").is_dir() else []
    sweep_file = run_dir.parent / "multirun.yaml"
    if sweep_file.is_file():
        candidates.append(sweep_file)
    return [path for path in candidates if _scrub_yaml(path)]
