"""Compose drivebench's packaged config (``drivebench/conf``) with Hydra, and say in one line what is wrong.

Hydra reports a bad override (an unknown key, a value of the wrong type, a group option that does not
exist) in several lines with its search path and exit code 1 (under ``-m``, after it has made the
sweep directory). The ``drivebench`` command composes every job of its command line here first
(:func:`check_command_line`), so that such an override stops before Hydra makes any directory, as one
``drivebench: error: <key>=<value> ...; valid ...`` line with exit code 2, as every other bad input
does. The doctor and the report compose their configs through :func:`compose` as well.
"""

from __future__ import annotations

import typing
from dataclasses import fields, is_dataclass
from typing import Any

from omegaconf import DictConfig

from drivebench.errors import ConfigError

CONFIG_MODULE = "drivebench.conf"
_BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def compose(overrides: list[str], config_name: str = "config", return_hydra_config: bool = False) -> DictConfig:
    """``hydra.compose`` on the packaged configs, checked by the schemas; ConfigError (one line) if it fails."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from drivebench.schemas import check

    overrides = list(overrides)
    try:
        if GlobalHydra.instance().is_initialized():  # inside a Hydra app or an initialize() block
            cfg = hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=return_hydra_config)
        else:
            with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
                cfg = hydra_compose(config_name=config_name, overrides=overrides,
                                    return_hydra_config=return_hydra_config)
        check(cfg)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(explain(err, overrides)) from None
    return cfg


def check_command_line(argv: list[str]) -> list[DictConfig]:
    """Compose each job that ``argv`` (Hydra's own command line) asks for; ConfigError for the first that fails.
    Returns the jobs' configs (with their ``hydra`` node), for checks that need more than the schemas.

    Left to Hydra: its flags that compose nothing (``--help``, ``--info``, shell completion) and the ones
    that change where configs come from (``--config-path``, ``--config-dir``, ``--experimental-rerun``).
    Under ``-m`` the jobs are expanded as Hydra's basic sweeper expands them (``hydra.sweeper.params``
    of the config, then the command line's sweeps).
    """
    from hydra._internal.utils import get_args_parser

    try:
        args = get_args_parser().parse_args(argv)
    except SystemExit:  # not a command line Hydra accepts: let Hydra print its usage
        return []
    check_hydra_modes(args)
    if (args.help or args.hydra_help or args.info or args.shell_completion or args.config_path
            or args.config_dir or args.experimental_rerun):
        return []
    name = args.config_name or "config"
    jobs = sweep_jobs(args.overrides, name) if args.multirun else [args.overrides]
    return [compose(job, name, return_hydra_config=True) for job in jobs]


_COMPLETION_COMMANDS = ("install", "uninstall", "query")


def check_hydra_modes(args: Any) -> None:
    """Hydra's mode flags that it refuses with a traceback (a ValueError once the run starts), refused here in one
    line instead: more than one of ``--run``, ``-m``, ``--cfg``, ``--info``, ``--shell-completion``; and
    ``--shell-completion`` without exactly one of its commands."""
    modes = [flag for flag, on in (("--run", args.run), ("-m", args.multirun), ("--cfg", args.cfg is not None),
                                   ("--info", args.info is not None), ("--shell-completion", args.shell_completion))
             if on]
    if len(modes) > 1:
        raise ConfigError(f"{' and '.join(modes)} cannot be combined (Hydra runs one of --run, -m, --cfg, --info "
                          "and --shell-completion): keep one")
    if args.shell_completion:
        given = [word.split("=", 1)[0] for word in args.overrides if word.split("=", 1)[0] in _COMPLETION_COMMANDS]
        if len(given) != 1:
            raise ConfigError("--shell-completion needs exactly one of install=SHELL, uninstall=SHELL or query=SHELL "
                              "(e.g. --shell-completion install=bash)")


def sweep_jobs(overrides: list[str], config_name: str = "config") -> list[list[str]]:
    """The override list of every job a ``-m`` run of ``overrides`` launches (basic sweeper)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(list(overrides))
    except HydraException as err:
        raise ConfigError(explain(err, overrides)) from None
    base = [o.input_line for o in parsed if not o.is_sweep_override() and o.input_line]
    cfg = compose(base, config_name, return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    if sweeper.get("_target_") != _BASIC_SWEEPER:
        return [base]  # another sweeper expands its own way: it validates its jobs itself
    params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    try:
        batches = BasicSweeper.split_arguments(parser.parse_overrides([*params, *overrides]), None)
    except HydraException:  # a sweep the basic sweeper cannot expand here (glob, interval): Hydra reports it
        return [base]
    return [list(job) for batch in batches for job in batch]


# ---- one line for Hydra's and OmegaConf's exceptions ------------------------------------------------------
def explain(err: BaseException, overrides: list[str] = ()) -> str:
    """``<key>=<value> is not ...; valid ...`` for a composition error, else its first line."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import (ConfigAttributeError, ConfigKeyError, MissingMandatoryValue,
                                  OmegaConfBaseException, ValidationError)

    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options is not None:
        group, _, choice = err.missing_cfg_file.rpartition("/")
        if group:
            return f"{group}={choice!r} is not valid; choose one of: {', '.join(sorted(err.options))}"
    cause = err if isinstance(err, OmegaConfBaseException) else err.__cause__
    if isinstance(cause, OmegaConfBaseException) and cause.full_key:
        key = str(cause.full_key)
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
            parent = key.rpartition(".")[0]
            where = parent or "the config"
            node = cause.parent_node
            keys = _valid_keys(node) if isinstance(node, DictConfig) else []
            listed = f"; valid keys: {', '.join(keys)}" if keys else ""
            given = _given(overrides, key)
            if isinstance(node, DictConfig) and "_target_" in node:  # an instantiated node takes more keywords
                listed += f"; a keyword of {node.get('_target_')} that the config does not list: +{key}={given}"
            return f"{key}={given} is not a key of {where}{listed}"
        if isinstance(cause, MissingMandatoryValue):
            return f"{key} has no value; set it: {key}=<value>"
        if isinstance(cause, ValidationError):
            expected = _expected_type(cause.object_type, str(cause.key))
            value = cause.value if cause.value is not None else _given(overrides, key)
            if expected:
                return f"{key}={value!r} is not valid; expected {expected}"
    return _first_line(err)


def _valid_keys(node: DictConfig) -> list[str]:
    from drivebench.schemas import valid_keys

    return valid_keys(node)


def _given(overrides: list[str], key: str) -> str:
    """The value text of the override that set ``key`` (``...`` when none did)."""
    for word in reversed(list(overrides)):
        name, sep, value = word.partition("=")
        if sep and name.lstrip("+~") == key:
            return value
    return "..."


def _expected_type(schema: Any, key: str) -> str | None:
    """What a schema field takes, in words (``a whole number``, ``true or false`` ...)."""
    if not is_dataclass(schema) or key not in {f.name for f in fields(schema)}:
        return None
    try:
        hint = typing.get_type_hints(schema)[key]
    except Exception:
        return None
    return _describe(hint)


def _describe(hint: Any) -> str | None:
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        described = _describe(inner[0]) if len(inner) == 1 else None
        if described == "true or false":
            return "true, false or null"
        return f"{described} or null" if described else None
    origin = typing.get_origin(hint)
    if origin in (list, tuple):
        return "a list, e.g. [a,b]"
    if origin is dict:
        return "a mapping, e.g. {key: value}"
    return {int: "a whole number", float: "a number", bool: "true or false", str: "a string"}.get(hint)


def _first_line(err: BaseException) -> str:
    text = str(err)
    if text.startswith("Ambiguous value"):  # Hydra's three numbered fixes, in one line
        return (f"{text.splitlines()[0]}: use key=[a,b] for a list, key='a,b' for one string, or -m to sweep "
                "over the values")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines and lines[0].endswith("raised while composing config:"):  # a config file itself is wrong
        return " ".join(lines[:3])  # In '<file>': ... Key '<key>' not in '<schema>' full_key: <key>
    return lines[0] if lines else type(err).__name__
