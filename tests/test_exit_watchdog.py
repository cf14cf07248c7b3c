"""A finished command whose process would not exit is ended by the watchdog, with thread stacks."""

import subprocess
import sys
import textwrap
import time

from drivebench.exit_watchdog import HUNG_EXIT_CODE

HANGS_AT_EXIT = textwrap.dedent("""
    import threading, time
    from drivebench.exit_watchdog import arm_exit_watchdog
    def blocker_that_never_returns():
        time.sleep(3600)
    threading.Thread(target=blocker_that_never_returns).start()  # non-daemon: blocks interpreter exit
    print("results written", flush=True)
    arm_exit_watchdog({seconds})
""")


def test_a_process_hung_at_exit_is_ended_with_stacks():
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", HANGS_AT_EXIT.format(seconds=1.0)], capture_output=True, text=True,
                          timeout=60)
    assert time.perf_counter() - t0 < 30
    assert proc.returncode == HUNG_EXIT_CODE
    assert "results written" in proc.stdout
    assert "did not exit within 1 s" in proc.stderr and "blocker_that_never_returns" in proc.stderr


def test_a_process_that_exits_is_not_touched():
    code = "from drivebench.exit_watchdog import arm_exit_watchdog; arm_exit_watchdog(30); print('ok')"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok"
    assert time.perf_counter() - t0 < 20
