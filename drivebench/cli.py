"""Command-line shims applied before Hydra parses ``sys.argv``.

Launchers differ in how they tell a process its local rank: ``torch.distributed.launch`` passes
``--local_rank=N`` (torch < 2) or ``--local-rank=N`` (torch >= 2), torchrun sets ``LOCAL_RANK``.
Hydra would reject the flags as malformed overrides, so every form is accepted here, removed from
argv, and exported as ``LOCAL_RANK`` (which Lightning's cluster environments read).
"""

from __future__ import annotations

import os
import re

_FLAG = re.compile(r"^--local[-_]rank(?:=(\d+))?$")


def pop_local_rank(argv: list[str], environ: dict[str, str] | None = None) -> list[str]:
    """Return ``argv`` without local-rank flags; set ``LOCAL_RANK`` in ``environ`` if one was given."""
    env = os.environ if environ is None else environ
    out: list[str] = []
    i = 0
    while i < len(argv):
        match = _FLAG.match(argv[i])
        if match is None:
            out.append(argv[i])
            i += 1
            continue
        value = match.group(1)
        if value is None:
            if i + 1 >= len(argv) or not argv[i + 1].isdigit():
                raise SystemExit(f"drivebench: error: {argv[i]} needs a rank number, e.g. {argv[i]}=0")
            value = argv[i + 1]
            i += 1
        env["LOCAL_RANK"] = value
        i += 1
    return out


def quote_storage_dirs(argv: list[str]) -> list[str]:
    """``bench=storage ckpt.dir=/a,/b`` means two candidates, not a Hydra sweep: quote the list."""
    if "bench=storage" not in argv:
        return argv
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+") in ("ckpt.dir", "bench.dirs") and "," in value and value[:1] not in "'\"[":
            arg = f"{key}='{value}'"
        out.append(arg)
    return out
