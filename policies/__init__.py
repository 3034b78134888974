"""Built-in policy plugins (import name ``adaptd.policies``).

Each module holds one small frozen dataclass policy; each is registered under the
``adaptd.policies`` entry-point group in ``pyproject.toml``.
"""

from adaptd.policies.budget import Budget
from adaptd.policies.daly import Daly
from adaptd.policies.default import Default
from adaptd.policies.fixed import Fixed
from adaptd.policies.guards import Guards
from adaptd.policies.io_aware import IoAware
from adaptd.policies.opportunistic import Opportunistic
from adaptd.policies.phased import Phased
from adaptd.policies.risk import Risk
from adaptd.policies.weibull import Weibull
from adaptd.policies.young import Young

__all__ = [
    "Budget",
    "Daly",
    "Default",
    "Fixed",
    "Guards",
    "IoAware",
    "Opportunistic",
    "Phased",
    "Risk",
    "Weibull",
    "Young",
]
