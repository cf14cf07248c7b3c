"""``drivebench [overrides]`` (or ``python -m drivebench``): compose the Hydra config and run the benchmark.

``drivebench report ...`` and ``drivebench doctor ...`` run the other two commands (also
``python -m drivebench.report`` / ``python -m drivebench.doctor``); all three take ``key=value``
overrides in Hydra's syntax (drivebench/cli.py).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from drivebench.errors import ConfigError

EXIT_BAD_INPUT = 2


@hydra.main(config_path="pkg://drivebench.conf", config_name="config", version_base="1.3")
def _main(cfg: DictConfig) -> None:
    from drivebench.app import main

    main(cfg)


def _report(argv: list[str]) -> int:
    from drivebench.report.cli import main

    return main(argv)


def _doctor(argv: list[str]) -> int:
    from drivebench.doctor.cli import main

    return main(argv)


COMMANDS = {"report": _report, "doctor": _doctor}


def main(argv: list[str] | None = None) -> None:
    """The ``drivebench`` console script: a subcommand, or a training run from Hydra overrides."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in COMMANDS:
        sys.exit(COMMANDS[args[0]](args[1:]))
    from drivebench.cli import pop_local_rank, quote_storage_dirs
    from drivebench.compose import check_command_line
    from drivebench.dist import external_rank_overrides
    from drivebench.exit_watchdog import arm_exit_watchdog, exit_timeout_from_env

    args = [*quote_storage_dirs(pop_local_rank(args)), *external_rank_overrides()]
    try:
        jobs = check_command_line(args)  # a bad override: one line and exit 2, before Hydra makes a run directory
        if jobs:
            from drivebench.app import check_before_start

            for job in jobs:  # a bad value or combination (the run's own checks): the same, before any job
                check_before_start(job)
    except ConfigError as err:
        print(f"drivebench: error: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    sys.argv = [sys.argv[0], *args]
    try:
        _main()
    finally:  # also after a failed run: an exit that hangs is never better
        arm_exit_watchdog(exit_timeout_from_env())


if __name__ == "__main__":
    main()
