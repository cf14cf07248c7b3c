"""CPython gh-112275 on demand: does a child started while another thread creates and deletes thread states hang?

A helper thread calls PyThreadState_New / _Clear / _Delete through ctypes.CDLL, which releases the GIL around
each call, as gloo's threads do when they free a finished collective's tensors (they take the interpreter's
thread-list lock without the GIL). The main thread starts N children by the given start method, one at a time,
and counts those that have not run their first line within 5 s; with --backtrace, gdb prints the first hung
child's stack before it is killed.

    python repro.py fork 1000
    python repro.py forkserver 200
    python repro.py fork 400 --backtrace
"""
import ctypes
import multiprocessing as mp
import subprocess
import sys
import threading
import time

api = ctypes.CDLL(None)  # the interpreter's own symbols, called without the GIL
api.PyThreadState_New.restype = ctypes.c_void_p
api.PyThreadState_New.argtypes = [ctypes.c_void_p]
api.PyThreadState_Clear.argtypes = [ctypes.c_void_p]
api.PyThreadState_Delete.argtypes = [ctypes.c_void_p]
ctypes.pythonapi.PyInterpreterState_Main.restype = ctypes.c_void_p
INTERP = ctypes.pythonapi.PyInterpreterState_Main()
running = True


def churn() -> None:
    while running:
        ts = api.PyThreadState_New(INTERP)
        api.PyThreadState_Clear(ts)
        api.PyThreadState_Delete(ts)


def child(q) -> None:
    q.put(1)


if __name__ == "__main__":
    method, n, backtrace = sys.argv[1], int(sys.argv[2]), "--backtrace" in sys.argv
    ctx = mp.get_context(method)
    q = ctx.Queue()
    threading.Thread(target=churn, daemon=True).start()
    hung, t0 = 0, time.time()
    for _ in range(n):
        p = ctx.Process(target=child, args=(q,))
        p.start()
        p.join(5)
        if p.is_alive():
            hung += 1
            if backtrace and hung == 1:
                bt = subprocess.run(["gdb", "-batch", "-p", str(p.pid), "-ex", "bt"], capture_output=True, text=True).stdout
                print("\n".join(line for line in bt.splitlines() if line.startswith("#"))[:2500])
            p.kill()
            p.join()
        else:
            q.get(timeout=5)
    running = False
    print(f"python {sys.version.split()[0]} {method}: {hung} of {n} children hung ({time.time() - t0:.1f} s)")
