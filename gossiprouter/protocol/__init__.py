"""Sans-IO codecs: bytes in, frames out; frames in, bytes out. No sockets live here."""
