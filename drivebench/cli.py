"""The command line of the three commands, before Hydra parses it.

All three take ``key=value`` overrides in Hydra's grammar: ``drivebench`` (training) the run's config
keys; ``drivebench report`` and ``drivebench doctor`` their own options as ``report.<key>=...`` /
``doctor.<key>=...`` (typed by ``drivebench.schemas.ReportOptions`` / ``DoctorOptions`` and composed by
Hydra, so an unknown key or a wrong type is refused the same way), the doctor the run's keys as well.
Their older ``--flag`` spellings are turned into those overrides here (:func:`flags_to_overrides`).

Launchers differ in how they tell a process its local rank: ``torch.distributed.launch`` passes
``--local_rank=N`` (torch < 2) or ``--local-rank=N`` (torch >= 2), torchrun sets ``LOCAL_RANK``.
Hydra would reject the flags as malformed overrides, so every form is accepted here, removed from
argv, and exported as ``LOCAL_RANK`` (which Lightning's cluster environments read).
"""

from __future__ import annotations

import os
import re

from drivebench.errors import ConfigError

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


# ---- the other commands' own options: `<command>.<key>=<value>`, as Hydra overrides --------------------
def hydra_quote(value: str) -> str:
    """``value`` as one quoted string in Hydra's override grammar (any character, ``<``, ``,`` and ``=`` too)."""
    escaped = re.sub(r"(\\+)('|$)", lambda m: m.group(1) * 2 + m.group(2), value).replace("'", "\\'")
    return f"'{escaped}'"


def own_option(word: str, command: str) -> bool:
    """Is ``word`` an override of ``command``'s own options (``report.out=...``, ``+doctor.json=...``)?"""
    key, sep, _ = word.partition("=")
    return bool(sep) and key.lstrip("+~").startswith(f"{command}.")


def flags_to_overrides(argv: list[str], command: str, valued: tuple[str, ...] = (),
                       switches: tuple[str, ...] = ()) -> list[str]:
    """The older ``--flag`` spellings as the command's overrides: ``--out X`` / ``--out=X`` ->
    ``report.out='X'``, ``--skip-slow`` -> ``doctor.skip_slow=true``; any other ``--flag`` is refused."""
    out: list[str] = []
    words = iter(argv)
    for word in words:
        if not word.startswith("--"):
            out.append(word)
            continue
        flag, sep, value = word.partition("=")
        key = f"{command}.{flag[2:].replace('-', '_')}"
        if flag in switches and not sep:
            out.append(f"{key}=true")
        elif flag in valued:
            if not sep:
                value = next(words, None)
                if value is None:
                    raise ConfigError(f"{flag} needs a value, e.g. {key}=<value>")
            out.append(f"{key}={hydra_quote(value)}")
        else:
            known = ", ".join([*valued, *switches])
            raise ConfigError(f"{flag} is not an option of drivebench {command}; valid options: {known} "
                              f"(or {command}.<key>=<value>)")
    return out


def asked_for_help(argv: list[str], usage: str, module_doc: str | None) -> bool:
    """Print ``usage`` and the module docstring's body when ``-h``/``--help`` is among the words
    (the report's and the doctor's own help: their options are overrides, not argparse flags)."""
    if not {"-h", "--help"} & set(argv):
        return False
    print(usage)
    print((module_doc or "").split("\n\n", 1)[-1].strip().replace("``", ""))
    return True
