"""``python -m gossiprouter``: the same as the ``gossiprouter`` command."""

from gossiprouter.cli import main

main()
