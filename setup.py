"""The optional compiled fast path, gossiprouter._relay (docs/performance.md, "Light load").

Everything else is declared in pyproject.toml. The extension is C99 with POSIX threads and
Linux's epoll and eventfd; on a platform without them, or without a C compiler, the build
leaves it out (``optional``) and the router runs its pure-Python path. ``scripts/setup`` and
``scripts/test`` require it on Linux, so CI cannot lose it unnoticed.
"""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildExt(build_ext):
    """Says in one line when the optional extension was not built (setuptools' own warning
    is one of many lines): pip shows it with -v, and the router says it at start-up."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception:
            if ext.optional:
                print("gossiprouter: the compiled fast path (gossiprouter._relay) was not "
                      "built: a C compiler and the Python headers are needed (apt-get install "
                      "gcc python3-dev, then install again); the router runs its pure-Python "
                      "path", file=sys.stderr, flush=True)
            raise

ext_modules = []
if sys.platform.startswith("linux"):
    ext_modules.append(Extension(
        "gossiprouter._relay",
        sources=["gossiprouter/_relay.c"],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                            "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
        extra_link_args=["-pthread"],
        optional=True,
    ))

setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildExt})
