"""The locked environment: pyproject.toml's ranges and requirements.lock (what `make test` installs)
tell the same story. Every direct dependency is in the lock, pinned with hashes, and its lower bound
is the locked version, so the oldest release the ranges promise is the one tested."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"


def _locked() -> dict[str, tuple[Version, int]]:
    """{package: (version, number of hashes)} of the lock file."""
    text = LOCK.read_text()
    pins = {}
    for block in re.split(r"\n(?=\S)", text):
        m = re.match(r"([A-Za-z0-9_.\-]+)==(\S+)", block)
        if m:
            pins[canonicalize_name(m[1])] = (Version(m[2]), block.count("--hash=sha256:"))
    return pins


def _direct() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in project["dependencies"] + extras["dev"] + extras["onnx"] + extras["ray"]]


def test_every_package_of_the_lock_is_pinned_with_hashes():
    pins = _locked()
    assert len(pins) > 40, "the lock holds the transitive dependencies too"
    unhashed = [name for name, (_, hashes) in pins.items() if hashes == 0]
    assert unhashed == []
    assert str(pins["torch"][0]) == "2.13.0+cpu", "the lock takes torch's CPU build"


@pytest.mark.parametrize("requirement", _direct(), ids=str)
def test_lower_bound_is_the_locked_version(requirement):
    pins = _locked()
    name = canonicalize_name(requirement.name)
    assert name in pins, f"{name} is a dependency but not in requirements.lock; run `make lock`"
    locked = Version(pins[name][0].public)
    assert requirement.specifier.contains(pins[name][0], prereleases=True), (
        f"the lock's {name} {locked} is outside {requirement}"
    )
    lows = [Version(s.version) for s in requirement.specifier if s.operator in (">=", "==")]
    assert lows == [locked], (
        f"{requirement}: the lower bound should be the locked, tested version {locked} "
        "(after `make lock`, move the bound in pyproject.toml)"
    )
