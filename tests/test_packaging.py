"""The install story from a checkout (issue 25, items 7 to 10): the build requirement that
the metadata needs, the LICENSE it names, and the example config generated from the option
declarations."""

from __future__ import annotations

import runpy
import subprocess
import tomllib
from pathlib import Path

from gossiprouter.core.config import OPTIONS, Config, build, example_toml, load_file

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXAMPLE = REPO / "docs" / "gossiprouter.example.toml"


def test_spdx_license_needs_setuptools_77_and_the_file_it_names() -> None:
    """``license = "Apache-2.0"`` (an SPDX expression) is setuptools >= 77 metadata: an
    older one, with --no-build-isolation, refuses the pyproject.toml."""
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert "setuptools>=77" in PYPROJECT["build-system"]["requires"]
    assert project["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0")
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_extras_are_named_by_what_they_bring() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert extras["metrics"] == ["prometheus-client>=0.20"]
    assert extras["bridge"] == ["paho-mqtt>=2.0"]
    assert "gossiprouter[bridge]" in extras["loadtest"]  # the topics load test federates
    assert extras["ops"] == ["gossiprouter[metrics,bridge]"]


def test_example_config_is_generated_from_the_options() -> None:
    """Every option, at its default: the file is what scripts/example-config writes."""
    assert EXAMPLE.read_text() == example_toml(), "stale: run scripts/example-config"
    values = load_file(EXAMPLE)
    assert set(values) == {o.name for o in OPTIONS}
    assert build(EXAMPLE) == Config()


def test_example_config_script_checks_and_writes() -> None:
    r = subprocess.run([str(REPO / "scripts" / "example-config"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_the_relay_is_built_from_every_c_file_and_ships_its_headers() -> None:
    """setup.py builds gossiprouter.server._relay from every .c of server/relay/ and rebuilds it
    when any of its headers changes (``depends``); pyproject.toml ships both, in the sdist and
    in the wheel."""
    setup_py = runpy.run_path(str(REPO / "setup.py"), run_name="test_packaging")
    ext = setup_py["relay_extension"]()
    folder = REPO / "gossiprouter" / "server" / "relay"

    def files(suffix: str) -> list[str]:
        return sorted(str(f.relative_to(REPO)) for f in folder.glob(f"*{suffix}"))

    assert ext.name == "gossiprouter.server._relay"
    assert sorted(ext.sources) == files(".c")
    assert sorted(ext.depends) == files(".h")
    data = PYPROJECT["tool"]["setuptools"]["package-data"]
    assert data["gossiprouter.server.relay"] == ["*.c", "*.h"]
