"""``python -m drivebench.doctor``: see :mod:`drivebench.doctor.cli`."""

import sys

from drivebench.doctor.cli import main

if __name__ == "__main__":
    sys.exit(main())
