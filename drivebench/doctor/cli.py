"""``drivebench doctor [overrides...] [doctor.json=PATH] [doctor.skip_slow=true]`` (also
``python -m drivebench.doctor``).

The overrides are a training run's (``model=...``, ``accel=...``, ``dist=...``, ``ckpt.dir=...``); the
doctor's own options are overrides too (drivebench/cli.py), typed by ``drivebench.schemas.DoctorOptions``:
``doctor.json=PATH`` also writes the records as JSON, ``doctor.skip_slow=true`` skips the storage
bandwidth, NCCL all-reduce and torch.compile checks. The older ``--json PATH`` and ``--skip-slow`` mean
the same. Exit codes: 0 fit to train (PASS / WARN / INFO only), 1 at least one FAIL, 2 the overrides
do not compose or a run would reject the config (one line on stderr, like a training run).
"""

from __future__ import annotations

import sys
from pathlib import Path

from drivebench.cli import asked_for_help
from drivebench.errors import ConfigError

COMMAND = "doctor"
USAGE = ("usage: drivebench doctor [KEY=VALUE ...] [doctor.json=PATH] [doctor.skip_slow=true]\n"
         "  (python -m drivebench.doctor; --json PATH and --skip-slow are the same options)")


def split_args(argv: list[str]) -> tuple[list[str], Path | None, bool]:
    """``(the run's overrides, doctor.json, doctor.skip_slow)``; ConfigError (one line) for a bad option."""
    from drivebench.cli import flags_to_overrides, own_option
    from drivebench.compose import compose

    words = flags_to_overrides(argv, COMMAND, valued=("--json",), switches=("--skip-slow",))
    own = [w for w in words if own_option(w, COMMAND)]
    options = compose(own, config_name="drivebench_doctor").doctor
    run = [w for w in words if not own_option(w, COMMAND)]
    return run, Path(options.json) if options.json else None, bool(options.skip_slow)


def main(argv: list[str] | None = None) -> int:
    """Run every check for the configured run; return the exit code."""
    from drivebench.cli import pop_local_rank

    argv = list(sys.argv[1:] if argv is None else argv)
    if asked_for_help(argv, USAGE, __doc__):
        return 0
    try:
        overrides, json_path, skip_slow = split_args(pop_local_rank(argv))
        from drivebench.doctor.context import build_context

        ctx = build_context(overrides, skip_slow=skip_slow)
    except ConfigError as err:
        print(f"drivebench.doctor: error: {err}", file=sys.stderr)
        return 2
    except ImportError as err:  # torch, hydra or omegaconf itself is broken: nothing can be composed
        print(f"drivebench.doctor: error: the core stack does not import ({type(err).__name__}: {err}); "
              "reinstall it with `pip install -e .`", file=sys.stderr)
        return 2
    from drivebench.doctor.registry import exit_code, run_checks
    from drivebench.doctor.report import Printer, to_json, write_json

    printer = Printer()
    printer.header(ctx)
    results = run_checks(ctx, on_result=printer.result)
    if json_path is not None:
        write_json(json_path, to_json(ctx, results))
    printer.footer(results, json_path)
    return exit_code(results)
