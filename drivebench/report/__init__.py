"""Read runs back: ``summary.json`` and TensorBoard events of any set of runs -> tables and plots.

Modules, in the order data flows: ``discovery`` (find run folders), ``events`` and ``loading``
(summaries and scalars -> pandas), ``analysis`` (ordering, speedup, time to target), ``tables`` and
``plots`` (markdown, CSV, terminal, PNG), ``render`` (all of it into one folder), ``cli``.
Notebooks use :func:`load_runs` and the figure functions of ``plots`` directly.
"""

from drivebench.report.analysis import Target, analyse, parse_target
from drivebench.report.loading import Problem, RunSet, load_runs
from drivebench.report.render import analysed, write_report

__all__ = ["Problem", "RunSet", "Target", "analyse", "analysed", "load_runs", "parse_target", "write_report"]
