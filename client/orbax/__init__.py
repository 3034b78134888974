"""adaptd for JAX jobs that checkpoint with Orbax (import name ``adaptd.client.orbax``;
``pip install 'adaptd[jax]'``).

:class:`SavePolicy` is an Orbax ``SaveDecisionPolicy`` backed by the adaptd daemon's
plan (docs/orbax.md). Imports JAX and Orbax, never TensorFlow.
"""

from __future__ import annotations

from adaptd.client.orbax.policy import AGREE_INTERVAL_S, SavePolicy

__all__ = ["AGREE_INTERVAL_S", "SavePolicy"]
