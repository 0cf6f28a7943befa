"""The package version, in a module of its own: the package front (``gossiprouter.__version__``)
and the operations layer (the ``gossiprouter_info`` metric) both read it, and neither should
have to load the other to do so."""

__version__ = "0.1.0"
