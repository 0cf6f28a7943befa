"""``python -m gossiprouter``: the same as the ``gossiprouter`` command."""

from gossiprouter.cli.main import main

main()
