"""Load testing: the record format that load-test peers write and the writers for it."""
