"""Built-in policy plugins (import name ``adaptd.policies``).

Each module holds one small frozen dataclass policy; each is registered under the
``adaptd.policies`` entry-point group in ``pyproject.toml``.
"""

from adaptd.policies.fixed import Fixed
from adaptd.policies.phased import Phased

__all__ = ["Fixed", "Phased"]
