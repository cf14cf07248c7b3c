"""The registry of checks (one list, in report order) and the runner that never lets one crash the rest."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterable

from drivebench.doctor import extensions, gpus, launcher, memory, storage, torch_compile, versions
from drivebench.doctor.context import DoctorContext
from drivebench.doctor.probe import error_text
from drivebench.doctor.result import Check, CheckResult, Status, informed, warned

CHECKS: list[Check] = [
    *versions.CHECKS,
    *extensions.CHECKS,
    *gpus.CHECKS,
    *memory.CHECKS,
    *storage.CHECKS,
    *torch_compile.CHECKS,
    *launcher.CHECKS,
]


def run_check(check: Check, ctx: DoctorContext) -> CheckResult:
    """Run one check; ``--skip-slow`` turns a slow one into INFO; an exception becomes a WARN line."""
    if check.slow and ctx.skip_slow:
        extra = ""
        if check.when_skipped is not None:
            try:
                extra = "; " + check.when_skipped(ctx)
            except Exception as err:
                extra = f"; ({error_text(err)})"
        result = informed(f"skipped (--skip-slow){extra}")
    else:
        started = time.perf_counter()
        try:
            result = check.run(ctx)
        except Exception as err:
            result = warned(f"the check itself crashed: {error_text(err)}",
                            "a bug in drivebench.doctor (the other checks are unaffected); please report it")
        result.data.setdefault("check_s", round(time.perf_counter() - started, 3))
    return dataclasses.replace(result, check=check.name)


def run_checks(ctx: DoctorContext, checks: Iterable[Check] = CHECKS,
               on_result: Callable[[CheckResult], None] | None = None) -> list[CheckResult]:
    """Run ``checks`` in order (calling ``on_result`` as each finishes), then remove what the doctor made."""
    results = []
    try:
        for check in checks:
            result = run_check(check, ctx)
            results.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        ctx.made.cleanup()
    return results


def exit_code(results: list[CheckResult]) -> int:
    return 1 if any(r.status is Status.FAIL for r in results) else 0
