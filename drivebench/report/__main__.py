"""``python -m drivebench.report DIR [DIR...] [--out OUTDIR] [--target METRIC<=VALUE ...]``."""

import sys

from drivebench.report.cli import main

if __name__ == "__main__":
    sys.exit(main())
