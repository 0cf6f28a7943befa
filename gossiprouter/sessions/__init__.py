"""Per-connection protocol sessions: bytes in, routing decisions and queued bytes out; no I/O."""
