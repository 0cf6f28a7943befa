"""Build gossiprouter.server._relay with a sanitizer into its own directory (scripts/sanitize).

    python benchmarks/relay_build.py address|thread [--out DIR]

prints the path of the built module, for ``GOSSIPROUTER_RELAY_SO``
(:mod:`gossiprouter.server.fastpath`). The build flags are setup.py's (:func:`relay_extension`, with
``GOSSIPROUTER_RELAY_SANITIZE`` set); the project's metadata is not read, so this needs only
setuptools and a C compiler, and the in-place build (``server/_relay*.so``) is untouched.
Rebuilt only when one of its C sources or headers (``gossiprouter/server/relay/``, as setup.py
lists them) or setup.py is newer than the module.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("address", "thread")


def built(mode: str, out: Path | None = None) -> Path:
    """The sanitized module for ``mode``, built first if it is missing or older than its
    sources; SystemExit with the compiler's output when the build fails."""
    from setuptools import Distribution  # type: ignore[import-untyped]
    from setuptools.command.build_ext import build_ext  # type: ignore[import-untyped]

    out = out or ROOT / "build" / f"relay-{mode}"
    setup_py = runpy.run_path(str(ROOT / "setup.py"), run_name="relay_build")
    sources = [ROOT / p for p in (*setup_py["RELAY_SOURCES"], *setup_py["RELAY_HEADERS"])]
    sources.append(ROOT / "setup.py")
    found = sorted(out.glob("gossiprouter/server/_relay*.so"))
    if found and all(found[0].stat().st_mtime > s.stat().st_mtime for s in sources):
        return found[0]
    os.environ["GOSSIPROUTER_RELAY_SANITIZE"] = mode
    cwd = os.getcwd()
    log = io.StringIO()
    try:
        os.chdir(ROOT)  # the extension's sources are relative to the checkout
        ext = setup_py["relay_extension"]()
        dist = Distribution({"name": "gossiprouter-relay", "ext_modules": [ext]})
        cmd = build_ext(dist)
        cmd.build_lib = str(out)
        cmd.build_temp = str(out / "tmp")
        cmd.force = True
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            cmd.ensure_finalized()
            cmd.run()
    except Exception as e:  # a compiler error is setuptools' CompileError, among others
        sys.stderr.write(log.getvalue())
        raise SystemExit(f"relay_build: the {mode} build failed: {e}") from None
    finally:
        os.chdir(cwd)
        del os.environ["GOSSIPROUTER_RELAY_SANITIZE"]
    found = sorted(out.glob("gossiprouter/server/_relay*.so"))
    if not found:
        raise SystemExit(f"relay_build: the {mode} build left no module in {out}")
    return found[0]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="relay_build", description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=MODES)
    ap.add_argument("--out", type=Path, help="build directory (default build/relay-MODE)")
    args = ap.parse_args(argv)
    print(built(args.mode, args.out))


if __name__ == "__main__":
    main()
