"""The hook's framework-neutral core imports no TensorFlow and no JAX; the Orbax adapter
imports no TensorFlow (adaptd.client.framework says which modules are which).

One subprocess in which ``import tensorflow`` fails (a meta-path finder that raises
on it and on its submodules) and, until the core is imported, ``import jax`` too."""

from __future__ import annotations

import importlib.util
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import adaptd.client
from adaptd.client.framework import ORBAX_SIDE, TENSORFLOW_SIDE

_PROBE = r"""
import importlib, json, sys

class Refuse:
    blocked = ("tensorflow", "jax", "jaxlib", "orbax")
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.blocked:
            raise ModuleNotFoundError(f"{name} is made unimportable by this test")
        return None

refuse = Refuse()
sys.meta_path.insert(0, refuse)
core, orbax = json.loads(sys.argv[1]), json.loads(sys.argv[2])
failed = {}
for name in core:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
refuse.blocked = ("tensorflow",)
for name in orbax:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"failed": failed, "tf": [m for m in sys.modules if m.startswith("tensorflow")]}))
"""


def client_modules() -> set[str]:
    path = adaptd.client.__path__
    found = {"adaptd.client"}
    for info in pkgutil.walk_packages(path, prefix="adaptd.client."):
        found.add(info.name)
    return found


def core_modules() -> list[str]:
    return sorted(client_modules() - TENSORFLOW_SIDE - ORBAX_SIDE)


def test_every_named_module_exists() -> None:
    """A renamed module leaves no stale name behind (it would silently join the core)."""
    assert client_modules() >= TENSORFLOW_SIDE
    assert client_modules() >= ORBAX_SIDE


def test_no_core_module_names_tensorflow_or_jax_in_its_source() -> None:
    """Also an import inside a function (the TensorFlow side imports lazily)."""
    offenders = []
    for name in core_modules():
        origin = importlib.util.find_spec(name).origin
        text = Path(origin).read_text()
        if any(w in text for w in ("import tensorflow", "import jax", "from jax", "import orbax")):
            offenders.append(name)
    assert offenders == []


def test_the_core_imports_without_tensorflow_and_the_orbax_adapter_too() -> None:
    core = core_modules()
    assert {"adaptd.client.follower", "adaptd.client.save.schedule",
            "adaptd.client.daemon.session"} <= set(core)  # fmt: skip
    orbax = sorted(ORBAX_SIDE) if importlib.util.find_spec("orbax") else []
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(core), json.dumps(orbax)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"failed": {}, "tf": []}
