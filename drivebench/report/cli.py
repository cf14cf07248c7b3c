"""``drivebench report DIR [DIR...] [report.out=OUTDIR] [report.target=METRIC<=VALUE ...]``
(also ``python -m drivebench.report``).

The report's options are overrides in Hydra's grammar, as everywhere in drivebench (drivebench/cli.py):
``report.out=``, ``report.target=`` (one target or a list ``[a,b]``; every ``report.target`` word adds to
the targets), ``report.dirs=[a,b]``; they are typed by ``drivebench.schemas.ReportOptions`` and composed by
Hydra, so ``report.outt=x`` is refused with the valid keys. The older ``--out X`` and ``--target X`` mean
the same. Every other word is a folder of runs. Exit codes: 0 report written; 2 bad input (no such
folder, no runs, a malformed target or option, or no completed run to compare and no convergence curve:
crashed runs are still listed in report.md; runs stopped by a signal still count in the convergence tables).
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from drivebench.cli import asked_for_help, flags_to_overrides, hydra_quote, own_option
from drivebench.errors import ConfigError

EXIT_BAD_INPUT = 2
COMMAND = "report"
USAGE = ("usage: drivebench report DIR [DIR...] [report.out=OUTDIR] [report.target=METRIC<=VALUE ...]\n"
         "  (python -m drivebench.report; --out OUTDIR and --target METRIC<=VALUE are the same options)")


@dataclass
class ReportArgs:
    """The report's options, composed."""

    dirs: list[Path] = field(default_factory=list)
    out: Path | None = None
    target: list[str] = field(default_factory=list)


def _target_items(value: str) -> list[str]:
    """The targets of one ``report.target=`` value, each quoted for Hydra (whose grammar has no
    unquoted ``<`` or ``>``): ``a<=1`` or ``[a<=1,b>=2]``; already quoted ones stay as written."""
    text = value.strip()
    items = text[1:-1].split(",") if text.startswith("[") and text.endswith("]") else [text]
    return [item if item[:1] in "'\"" else hydra_quote(item) for item in (i.strip() for i in items) if item]


def parse_args(argv: list[str]) -> ReportArgs:
    """Folders and options of a report command line (ConfigError, one line, for a bad one)."""
    from drivebench.compose import compose

    words = flags_to_overrides(argv, COMMAND, valued=("--out", "--target"))
    overrides, targets, folders = [], [], []
    for word in words:
        if not own_option(word, COMMAND):
            folders.append(word)
        elif word.partition("=")[0].lstrip("+") == "report.target":
            targets += _target_items(word.partition("=")[2])
        else:
            overrides.append(word)
    if targets:
        overrides.append(f"report.target=[{','.join(targets)}]")
    options = compose(overrides, config_name="drivebench_report").report
    dirs = [Path(d) for d in [*folders, *options.dirs]]
    if not dirs:
        raise ConfigError("give at least one folder of runs, e.g. drivebench report outputs/multirun")
    return ReportArgs(dirs=dirs, out=Path(options.out) if options.out else None, target=list(options.target))


def _fail(message: str) -> int:
    print(f"drivebench.report: error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if asked_for_help(argv, USAGE, __doc__):
        return 0
    try:
        args = parse_args(argv)
    except ConfigError as err:
        return _fail(str(err))
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
    if args.out is not None:  # before reading any run: a folder that cannot be made fails in one line, at once
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            return _fail(f"report.out={out}: cannot create that folder ({err.strerror}); give a writable one")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # third-party deprecation chatter; our own warnings are printed
            result = write_report(args.dirs, out, targets)
    except (FileNotFoundError, NotADirectoryError, NoRunsFound) as err:
        return _fail(str(err))
    except PermissionError as err:
        return _fail(f"cannot write the report to {out}: {err}")
    print(result.terminal_text)
    if result.completed == 0 and not result.convergence:
        return _fail(f"no completed run to compare ({len(result.problems)} did not complete; listed in "
                     f"{result.files['report.md']})")
    return 0
