"""The simulator behind ``adaptd simulate``: scenarios, the event engine, comparisons.

It drives the same policy objects and the same :class:`~adaptd.core.estimators.JobTracker`
the daemon uses, with synthetic snapshots and save reports, so a policy that learns
online here learns exactly as it would in production.
"""

from adaptd.sim.engine import FailureClock, RunResult, run
from adaptd.sim.runner import ORACLE, Summary, compare, resolve
from adaptd.sim.scenario import Phase, Scenario, ScenarioError, builtin_names, from_dict, load

__all__ = [
    "ORACLE",
    "FailureClock",
    "Phase",
    "RunResult",
    "Scenario",
    "ScenarioError",
    "Summary",
    "builtin_names",
    "compare",
    "from_dict",
    "load",
    "resolve",
    "run",
]
