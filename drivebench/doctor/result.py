"""What one check reports, and the registry entry that names it.

A check is a small function ``(DoctorContext) -> CheckResult``. It does not name itself: the
registry entry (:class:`Check`) does, and the runner stamps the name on the result, so a family
module is a list of plain functions plus one ``CHECKS`` list.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from drivebench.doctor.context import DoctorContext


class Status(str, Enum):
    """PASS: fit. WARN: works, but slower or fragile. FAIL: a run would break. INFO: optional, absent."""

    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    INFO = "INFO"


@dataclass
class CheckResult:
    """One line of the doctor's report (and one record of ``--json``)."""

    check: str
    status: Status
    saw: str
    remedy: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["status"] = self.status.value
        return out


def passed(saw: str, data: dict[str, Any] | None = None) -> CheckResult:
    return CheckResult("", Status.PASS, saw, "", data or {})


def warned(saw: str, remedy: str, data: dict[str, Any] | None = None) -> CheckResult:
    return CheckResult("", Status.WARN, saw, remedy, data or {})


def failed(saw: str, remedy: str, data: dict[str, Any] | None = None) -> CheckResult:
    return CheckResult("", Status.FAIL, saw, remedy, data or {})


def informed(saw: str, remedy: str = "", data: dict[str, Any] | None = None) -> CheckResult:
    return CheckResult("", Status.INFO, saw, remedy, data or {})


@dataclass(frozen=True)
class Check:
    """A registry entry: the check's stable name, its function, and whether ``--skip-slow`` skips it."""

    name: str
    run: Callable[["DoctorContext"], CheckResult]
    slow: bool = False
    when_skipped: Callable[["DoctorContext"], str] | None = None  # extra words for the skipped line

    @property
    def summary(self) -> str:
        """First line of the check function's docstring (what it looks at)."""
        return (self.run.__doc__ or "").strip().splitlines()[0] if self.run.__doc__ else ""
