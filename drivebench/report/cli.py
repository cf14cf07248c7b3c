"""``python -m drivebench.report DIR [DIR...] [--out OUTDIR] [--target METRIC<=VALUE ...]``.

Hydra-style words work too (``report.target='val/minFDE<=2.0'``, ``report.out=...``), as the rest of
drivebench is driven by ``key=value`` overrides. Exit codes: 0 report written; 2 bad input (no
such folder, no runs, a malformed target, or no completed run to compare: crashed runs are still
listed in report.md).
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from pathlib import Path

_HYDRA_STYLE = re.compile(r"^\+{0,2}report\.(?P<key>target|targets|out|dir|dirs)=(?P<value>.*)$")
EXIT_BAD_INPUT = 2


def _split_list(value: str) -> list[str]:
    value = value.strip()
    if value.startswith("[") and value.endswith("]"):
        return [v.strip().strip("'\"") for v in value[1:-1].split(",") if v.strip()]
    return [value.strip("'\"")]


def translate_hydra_style(argv: list[str]) -> list[str]:
    """``report.target=X`` -> ``--target X``; ``report.out=X`` -> ``--out X``; ``report.dirs=[a,b]`` -> a b."""
    out: list[str] = []
    for word in argv:
        match = _HYDRA_STYLE.match(word)
        if match is None:
            out.append(word)
            continue
        key, values = match["key"], _split_list(match["value"])
        if key in ("target", "targets"):
            out += [f"--target={v}" for v in values]
        elif key == "out":
            out.append(f"--out={values[0]}")
        else:
            out += values
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m drivebench.report",
        description="Table and plots over any set of drivebench runs (single runs, multirun sweeps, runs "
                    "copied from other machines). Writes report.md, report.csv and PNG plots.")
    parser.add_argument("dirs", nargs="*", type=Path, help="folders holding runs (searched recursively)")
    parser.add_argument("--out", type=Path, default=None, help="where to write the report (default: the first DIR)")
    parser.add_argument("--target", action="append", default=[], metavar="METRIC<=VALUE",
                        help="a quality target, e.g. 'val/minFDE<=2.0' or 'train/loss<=30' (>=, <, > too); "
                             "repeat for several. Quote it: < and > are shell redirections.")
    args = parser.parse_args(translate_hydra_style(argv))
    if not args.dirs:
        parser.error("give at least one folder of runs, e.g. python -m drivebench.report outputs/multirun")
    return args


def _fail(message: str) -> int:
    print(f"drivebench.report: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    from drivebench.report.analysis import parse_target
    from drivebench.report.discovery import NoRunsFound
    from drivebench.report.render import write_report

    try:
        targets = [parse_target(t) for t in args.target]
    except ValueError as err:
        return _fail(str(err))
    out = args.out or args.dirs[0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # third-party deprecation chatter; our own warnings are printed
            result = write_report(args.dirs, out, targets)
    except (FileNotFoundError, NotADirectoryError, NoRunsFound) as err:
        return _fail(str(err))
    except PermissionError as err:
        return _fail(f"cannot write the report to {out}: {err}")
    print(result.terminal_text)
    if result.completed == 0:
        return _fail(f"no completed run to compare ({len(result.problems)} did not complete; listed in "
                     f"{result.files['report.md']})")
    return 0
