"""scripts/run from a fresh copy of the repository, on a machine without Java, as a
user who is not root: it installs only the router, listens, and is idempotent.

The copy holds the files git tracks (no .venv); PATH holds only the few programs the
scripts use, so no java, javac or apt-get can be found. It installs from the package index
like a user would (the first run takes seconds), so it is marked slow.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.procs import REPO, free_port, wait_listening

# What scripts/run and scripts/setup --router call, and nothing else.
TOOLS = ("bash", "cat", "cut", "dirname", "env", "sed", "sha256sum")


def _python() -> str | None:
    """A system Python 3.11+ that any user may run (not this virtualenv's)."""
    for cand in ("/usr/local/bin/python3", "/usr/bin/python3"):
        if os.access(cand, os.X_OK):
            r = subprocess.run([cand, "-c", "import sys, venv; print(sys.version_info >= (3, 11))"],
                               capture_output=True, text=True)
            if r.stdout.strip() == "True":
                return cand
    return None


def _copy(dest: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


@pytest.mark.slow
def test_run_starts_the_router_without_java_or_root() -> None:
    py = _python()
    if py is None or shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a system python3 >= 3.11 with venv, and a git checkout")
    # Not pytest's tmp_path: its parent is private to root, and the user here is not.
    with tempfile.TemporaryDirectory(prefix="gossiprouter-run-") as tmp:
        _run_twice(Path(tmp), py)


def _run_twice(tmp_path: Path, py: str) -> None:
    clone, bin_dir, home = tmp_path / "clone", tmp_path / "bin", tmp_path / "home"
    for d in (clone, bin_dir, home):
        d.mkdir()
    _copy(clone)
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    (bin_dir / "python3").symlink_to(py)
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k in ("LANG",)}
    env |= {"PATH": str(bin_dir), "HOME": str(home)}
    user = None
    if os.geteuid() == 0:  # run it as nobody, as the user without root did
        user = pwd.getpwnam("nobody").pw_uid
        tmp_path.chmod(0o755)
        for p in (clone, bin_dir, home, *clone.rglob("*"), *home.rglob("*")):
            os.chown(p, user, -1, follow_symlinks=False)
    port = free_port()

    def run() -> tuple[float, str]:
        start = time.monotonic()
        proc = subprocess.Popen([str(clone / "scripts" / "run"), "--port", str(port)],
                                cwd=clone, env=env, user=user, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            wait_listening(port, proc, timeout=300)  # type: ignore[arg-type]
        except (RuntimeError, TimeoutError) as e:
            proc.kill()
            raise AssertionError(f"{e}\n{proc.communicate()[1]}") from None
        took = time.monotonic() - start
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        return took, err

    took, err = run()
    print(f"fresh copy: listening after {took:.1f} s")
    assert "installing gossiprouter and its dependencies" in err
    # The next commands are printed with a path that works.
    assert f". {clone}/.venv/bin/activate" in err
    assert f"gossiprouter members 127.0.0.1:{port} demo" in err
    # Only the router's dependencies: none of the development stack.
    r = subprocess.run([str(clone / ".venv/bin/python"), "-c",
                        "import importlib.util as u; print([m for m in ('pyspark', 'mypy', "
                        "'pytest', 'pyarrow', 'trio', 'msgpack', 'click') if u.find_spec(m)])"],
                       capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "['trio', 'msgpack', 'click']"

    took, err = run()  # already set up: nothing installed again
    print(f"second run: listening after {took:.1f} s")
    assert "installing" not in err and "setup:" not in err

    # A C compiler installed since: the fast path's build is tried again (issue 25, item 8),
    # whether or not it then succeeds with the few tools on this PATH.
    for tool in ("gcc", "cc"):
        found = shutil.which(tool)
        if found is not None:
            (bin_dir / tool).symlink_to(found)
    if shutil.which("gcc") or shutil.which("cc"):
        took, err = run()
        assert "building the compiled fast path" in err, err


def test_setup_modes_and_full_package_list() -> None:
    """scripts/setup --router touches no apt; the full mode installs the Debian packages
    the tests need."""
    text = (REPO / "scripts" / "setup").read_text()
    start = text.index('if [ "$mode" = router ]')
    router_part = text[start : text.index("\nfi\n", start)]
    assert "apt-get" not in router_part and "[test" not in router_part
    for pkg in ("default-jdk-headless", "libjgroups-java", "mosquitto", "chromium",
                "chromium-driver"):
        assert f"need_apt+=({pkg})" in text, pkg
    run = (REPO / "scripts" / "run").read_text()
    assert "scripts/setup --router" in run
    r = subprocess.run([str(REPO / "scripts" / "setup"), "--bogus"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "unknown option --bogus" in r.stderr
