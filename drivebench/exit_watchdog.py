"""Bound the time between "results written" and "process gone".

Why: on the GPU machine some runs (QCNet, DDP) finished, wrote their summary and then did not exit
(25+ s until the benchmark script's timeout killed them), which wastes device time and looks like a
hung job to a scheduler. Once the command's work is done, a watchdog waits ``seconds``; if the
interpreter is still alive then (a non-daemon thread, a worker pool or a driver call blocking
shutdown), it prints every thread's stack, so the culprit is visible in the log, and ends the
process. The results are already on disk at that point; the exit status says what happened.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading

HUNG_EXIT_CODE = 3  # distinct from 1 (run failed) and 2 (bad config): the run worked, exiting did not


def arm_exit_watchdog(seconds: float) -> None:
    """Force the process out ``seconds`` from now, with thread stacks on stderr first."""
    if seconds <= 0:
        return

    def fire() -> None:
        try:
            stderr_line(f"drivebench: the work is done and its results are written, but the process did not exit "
                        f"within {seconds:g} s; stacks of all threads follow, then a forced exit "
                        f"(status {HUNG_EXIT_CODE}). Set DRIVEBENCH_EXIT_TIMEOUT_S=0 to wait instead.")
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            stderr_line(None)
        except (OSError, ValueError):  # no stderr to dump to: the exit matters more than the stacks
            pass
        finally:
            os._exit(HUNG_EXIT_CODE)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True  # never itself a reason to stay alive
    timer.start()
    # late in interpreter shutdown Python threads no longer run: the C-level fallback still fires
    faulthandler.dump_traceback_later(seconds + 15, exit=True)


def stderr_line(line: str | None) -> None:
    """One line (or, with None, a flush) on stderr that cannot raise. Why: a thread that ends its process
    (this watchdog, the rank and launcher watches of drivebench.dist) must reach ``os._exit`` even when stderr's
    reader is gone, as when a killed launcher took the pipe's only reading end with it (EPIPE)."""
    try:
        if line is not None:
            print(line, file=sys.stderr, flush=True)
        else:
            sys.stderr.flush()
    except (OSError, ValueError):  # broken pipe, or stderr closed
        pass


def exit_timeout_from_env(default: float = 60.0) -> float:
    value = os.environ.get("DRIVEBENCH_EXIT_TIMEOUT_S")
    if value is None or value == "":
        return default
    try:
        return float(value)
    except ValueError:
        print(f"drivebench: warning: DRIVEBENCH_EXIT_TIMEOUT_S={value!r} is not a number of seconds; using "
              f"{default:g}", file=sys.stderr)
        return default
