"""Is this machine and environment fit to train, and what to change (``python -m drivebench.doctor``).

One module per family of checks (versions, extensions, gpus, memory, storage, torch_compile,
launcher); each check is a small function returning a :class:`CheckResult`, listed in
:data:`drivebench.doctor.registry.CHECKS`. Training's ``dist.p2p=auto`` reads the doctor's
measured verdict with :func:`cached_p2p_verdict`. Importing this package stays light (no torch,
no Lightning): the child probes it starts import it too.
"""

from drivebench.hardware.p2p import cached_p2p_verdict
from drivebench.doctor.result import CheckResult, Status

__all__ = ["CheckResult", "Status", "cached_p2p_verdict"]
