"""The optional compiled fast path, gossiprouter.server._relay (docs/performance.md, "Light load").

Everything else is declared in pyproject.toml. The extension is C99 with POSIX threads and
Linux's epoll and eventfd; on a platform without them, or without a C compiler, the build
leaves it out (``optional``) and the router runs its pure-Python path. ``scripts/setup`` and
``scripts/test`` require it on Linux, so CI cannot lose it unnoticed.

``GOSSIPROUTER_RELAY_SANITIZE=address`` (ASAN and UBSAN, every report fatal, and the read
buffer allocated to the byte so that ASAN sees any over-read) or ``=thread`` (TSAN) makes
:func:`relay_extension` the extension for the fast path's proof (docs/architecture.md, "The
fast path's proof"). ``benchmarks/relay_build.py`` (run by ``scripts/sanitize``) builds each
into its own directory under ``build/``, so the normal in-place build is never replaced by a
sanitized one.
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ENV = "GOSSIPROUTER_RELAY_SANITIZE"

# The extension's C files (gossiprouter/server/relay/relay.h says what each one holds) and the
# headers they share: the build depends on both (a changed header rebuilds the module), and
# both ship in the sdist and the wheel (pyproject.toml, package-data).
RELAY_DIR = "gossiprouter/server/relay"
RELAY_SOURCES = [f"{RELAY_DIR}/{name}.c" for name in ("module", "conns", "loop", "framing",
                                                      "routes", "broker", "link", "inbound",
                                                      "sha256", "workers")]
RELAY_HEADERS = [f"{RELAY_DIR}/{name}.h" for name in ("relay", "conns", "loop", "framing",
                                                      "routes", "broker", "inbound", "sha256",
                                                      "workers")]

# mode -> (compile flags, link flags)
SANITIZE = {
    "": ([], []),
    "address": (["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                 "-fno-omit-frame-pointer", "-DRELAY_EXACT_READ_BUFFER"],
                ["-fsanitize=address,undefined"]),
    "thread": (["-fsanitize=thread"], ["-fsanitize=thread"]),
}


class BuildExt(build_ext):
    """Says in one line when the optional extension was not built (setuptools' own warning
    is one of many lines): pip shows it with -v, and the router says it at start-up."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception:
            if ext.optional:
                print("gossiprouter: the compiled fast path (gossiprouter.server._relay) was not "
                      "built: a C compiler and the Python headers are needed (apt-get install "
                      "gcc python3-dev, then install again); the router runs its pure-Python "
                      "path", file=sys.stderr, flush=True)
            raise


def relay_extension() -> Extension:
    """gossiprouter.server._relay, built as ``GOSSIPROUTER_RELAY_SANITIZE`` says (unset: the normal
    build)."""
    sanitize = os.environ.get(ENV, "").strip()
    if sanitize not in SANITIZE:
        sys.exit(f"setup.py: {ENV}={sanitize!r}: expected address or thread")
    compile_args, link_args = SANITIZE[sanitize]
    return Extension(
        "gossiprouter.server._relay",
        sources=RELAY_SOURCES,
        depends=RELAY_HEADERS,
        # -O1 -g under a sanitizer: reports with whole stacks, at a usable speed.
        extra_compile_args=[*(["-O1", "-g"] if sanitize else ["-O2"]), "-std=gnu11", "-Wall",
                            "-Wextra", "-Wno-unused-parameter",
                            "-Wno-missing-field-initializers", "-Wno-cast-function-type",
                            *compile_args],
        extra_link_args=["-pthread", *link_args],
        # A sanitized build that fails must say so, not leave the proof without its module.
        optional=not sanitize,
    )


if __name__ == "__main__":  # as setuptools' build backend runs it; relay_build.py imports it
    setup(ext_modules=[relay_extension()] if sys.platform.startswith("linux") else [],
          cmdclass={"build_ext": BuildExt})
