"""The optional compiled fast path, gossiprouter._relay (docs/performance.md, "Light load").

Everything else is declared in pyproject.toml. The extension is C99 with POSIX threads and
Linux's epoll and eventfd; on a platform without them, or without a C compiler, the build
leaves it out (``optional``) and the router runs its pure-Python path. ``scripts/setup`` and
``scripts/test`` require it on Linux, so CI cannot lose it unnoticed.
"""

import sys

from setuptools import Extension, setup

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

setup(ext_modules=ext_modules)
