"""``python -m drivebench.doctor [hydra overrides...] [--json PATH] [--skip-slow]``.

Exit codes: 0 fit to train (PASS / WARN / INFO only), 1 at least one FAIL, 2 the overrides do not
compose or a run would reject the config (one line on stderr, like a training run).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from drivebench.errors import ConfigError


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m drivebench.doctor",
        description="Is this machine and environment fit to train drivebench, and what to change. Takes the "
                    "same Hydra overrides as a training run (model=..., accel=..., dist=..., ckpt.dir=..., "
                    "data.root=...).")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for `python -m drivebench`")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the records as JSON")
    parser.add_argument("--skip-slow", action="store_true",
                        help="skip the storage bandwidth, NCCL all-reduce and torch.compile checks")
    return parser.parse_intermixed_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run every check for the configured run; return the exit code."""
    from drivebench.cli import pop_local_rank

    args = parse_args(pop_local_rank(list(sys.argv[1:] if argv is None else argv)))
    try:
        from drivebench.doctor.context import build_context

        ctx = build_context(args.overrides, skip_slow=args.skip_slow)
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
    if args.json is not None:
        write_json(args.json, to_json(ctx, results))
    printer.footer(results, args.json)
    return exit_code(results)
