"""Make ``+experiment=<name>`` work from any working directory.

Hydra finds this class by scanning the ``hydra_plugins`` namespace package (no ``__init__.py`` in
``hydra_plugins/`` itself, so it merges with other installed plugins such as the submitit
launcher). The experiments folder is located from this file, not from the working directory, so
``python -m drivebench -m +experiment=smoke`` composes the same way wherever it is started.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

EXPERIMENTS_DIR = Path(__file__).resolve().parents[2] / "experiments"


class DrivebenchSearchPathPlugin(SearchPathPlugin):
    """Appends ``file://<repo>/experiments`` (groups ``experiment/`` and ``accel_step/``).

    A non-editable install has no experiments folder next to it: then nothing is added, and
    ``hydra.searchpath=[file:///path/to/drivebench/experiments]`` does the same by hand.
    """

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if EXPERIMENTS_DIR.is_dir():
            search_path.append(provider="drivebench-experiments", path=f"file://{EXPERIMENTS_DIR}")
