"""``python -m gossiprouter.loadtest.attacks CONFIG``: the attack process (:mod:`.process`)."""

from gossiprouter.loadtest.attacks.process import main

main()
