"""constraints.txt, the versions `make` and CI install, against requirements*.txt's ranges.

pip given `-r requirements.txt -c constraints.txt` fails to resolve (on a fresh machine: CI)
where a pin lies outside a requirement's range, so a requirement changed without the pins
regenerated (constraints.txt's header says how) is caught here, before CI.
"""

import os

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _lines(name):
    with open(os.path.join(REPO, name), encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-r"):
                yield line


def _pins():
    pins = {}
    for line in _lines("constraints.txt"):
        requirement = Requirement(line)
        (spec,) = requirement.specifier  # one exact pin per package
        assert spec.operator == "==" and not requirement.extras, line
        name = canonicalize_name(requirement.name)
        assert name not in pins, f"{line}: pinned twice"
        pins[name] = Version(spec.version)
    return pins


def test_every_requirement_is_pinned_within_its_range():
    pins = _pins()
    required = [Requirement(line) for name in ("requirements.txt", "requirements-dev.txt")
                for line in _lines(name)]
    assert len(required) > 20  # both files were read
    outside = [f"{r} (pinned {pins.get(canonicalize_name(r.name))})" for r in required
               if canonicalize_name(r.name) not in pins
               or not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)]
    assert not outside, ("requirements outside constraints.txt's pins; regenerate it as its "
                         f"header says: {outside}")


def test_the_pins_hold_what_the_extras_install():
    # requirements.txt asks for jax[cpu] and apache-beam[tfrecord]: their extras' packages
    # (jaxlib; Beam's crcmod) must be pinned too, or pip takes their newest release.
    pins = _pins()
    assert {"jaxlib", "crcmod", "jax", "apache-beam"} <= set(pins)
    assert pins["jaxlib"] == pins["jax"]  # jax[cpu] asks for jaxlib of its own version
