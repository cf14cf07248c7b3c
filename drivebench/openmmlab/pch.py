"""A C++ compiler wrapper for the mmcv build: precompiles mmcv's common op header once (a GCC PCH).

Why: 63 of mmcv's 77 C++ files start with ``#include "pytorch_cpp_helper.hpp"``, which pulls in
torch's headers; parsing them is about 4.3 s of each file's 6-7 s (2 cores, -O3). GCC uses
``<header>.gch`` instead of the header when it was made with the same flags, and silently ignores it
otherwise, so the .gch is made from the compile command itself: the first compile through this wrapper
takes a file lock, precompiles the header with that command's flags (its source, ``-o`` and dependency
outputs replaced) and then compiles as asked; the others wait for the lock and find the .gch made.
The .gch lives in ``<header>.gch/<hash of the flags>.gch`` (GCC tries every file of a ``.gch``
directory), so a compile with other flags gets its own and never a wrong one.

Everything else (links, ``-v``, a compile of a non-C++ file) passes through unchanged, and so does
every compile: the wrapper only adds the .gch next to the header and then runs the compiler with the
arguments it was given. If precompiling fails, the build goes on without it (one line on stderr).

Standard library only: the wrapper runs as ``python -I -S pch.py <args>`` (isolated, no site), from
``CXX``, which torch's ninja file and setuptools' link both use. Settings (environment):
``DRIVEBENCH_PCH_CXX`` the real compiler (default ``c++``), ``DRIVEBENCH_PCH_HEADER`` the header's path
(unset: pure pass-through).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: mmcv's build there uses MSVC, which this wrapper does not serve
    fcntl = None  # type: ignore[assignment]

REAL_ENV = "DRIVEBENCH_PCH_CXX"
HEADER_ENV = "DRIVEBENCH_PCH_HEADER"
SOURCE_SUFFIXES = (".cpp", ".cc", ".cxx", ".c++", ".C")
# options whose value is the next argument and names an output of this one compile (dropped for the header)
OUTPUT_OPTIONS = ("-o", "-MF", "-MT", "-MQ")
# flags that only concern this compile's outputs (dependency files) or say "compile only"
DROPPED_FLAGS = ("-c", "-MMD", "-MD", "-MP")
# options whose value is the next argument (so that value is not mistaken for the source)
VALUE_OPTIONS = (*OUTPUT_OPTIONS, "-I", "-D", "-U", "-include", "-imacros", "-isystem", "-iquote", "-idirafter",
                 "-x", "-Xlinker", "-L", "-l")


def header_flags(args: list[str]) -> list[str] | None:
    """The flags of a compile of one C++ source, minus that source, its outputs and dependency files;
    None when ``args`` is not such a compile (a link, ``-v``, several sources, a header)."""
    if "-c" not in args:
        return None
    flags: list[str] = []
    sources = 0
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in OUTPUT_OPTIONS:
            i += 2
            continue
        if arg in VALUE_OPTIONS:
            flags += args[i:i + 2]
            i += 2
            continue
        if arg.startswith("-"):
            if arg not in DROPPED_FLAGS:
                flags.append(arg)
        elif arg.endswith(SOURCE_SUFFIXES):
            sources += 1
        else:
            return None  # an input this wrapper does not know (an object, a library): not one C++ compile
        i += 1
    return flags if sources == 1 else None


def gch_path(header: Path, real: list[str], flags: list[str]) -> Path:
    """``<header>.gch/<hash>.gch``: one precompiled header per compiler and flag set."""
    key = hashlib.sha256("\0".join([*real, *flags]).encode()).hexdigest()[:16]
    return header.with_name(header.name + ".gch") / f"{key}.gch"


def ensure_gch(header: Path, real: list[str], flags: list[str]) -> Path | None:
    """Make the .gch for these flags unless it (or a failed attempt) is there; under a lock, so
    concurrent compiles make it once. Returns the .gch, or None where it could not be made."""
    gch = gch_path(header, real, flags)
    # side files next to the header, not in the .gch directory (GCC would try them as headers)
    side = header.with_name(f".{header.name}.{gch.stem}")
    failed = side.with_name(side.name + ".failed")
    if gch.exists():
        return gch
    if failed.exists() or fcntl is None:
        return None
    gch.parent.mkdir(exist_ok=True)
    with open(side.with_name(side.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if gch.exists():
            return gch
        if failed.exists():
            return None
        tmp = side.with_name(f"{side.name}.{os.getpid()}.tmp")
        cmd = [*real, *flags, "-x", "c++-header", str(header), "-o", str(tmp)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not tmp.exists():
            failed.write_text(f"{shlex.join(cmd)}\nexit {proc.returncode}\n{proc.stdout}{proc.stderr}")
            tmp.unlink(missing_ok=True)
            print(f"drivebench pch: precompiling {header.name} failed (exit {proc.returncode}, see {failed}); "
                  "compiling without it", file=sys.stderr, flush=True)
            return None
        os.replace(tmp, gch)
        print(f"drivebench pch: precompiled {header.name} in {time.perf_counter() - t0:.1f} s "
              f"({gch.stat().st_size / 2**20:.0f} MB): {gch}", file=sys.stderr, flush=True)
    return gch


def main(args: list[str]) -> int:
    real = shlex.split(os.environ.get(REAL_ENV) or "c++")
    header = os.environ.get(HEADER_ENV)
    if header:
        flags = header_flags(args)
        if flags is not None:
            ensure_gch(Path(header), real, flags)
    os.execvp(real[0], [*real, *args])  # the compile (or link) exactly as asked
    return 127  # not reached: execvp replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
