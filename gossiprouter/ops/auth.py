"""Native-protocol authentication: the tokens file and what each identity may do.

The tokens file (TOML) lists tokens; each names an *identity* and the groups
that identity may use, as glob patterns::

    [[token]]
    identity = "billing"
    token = "k2Jv0...a long random string"   # or: sha256 = "<hex SHA-256 of the token>"
    groups = ["billing", "billing-*"]

A client sends its token in HELLO. An unknown or missing token is refused
(ERROR ``unauthorized``, then close). CONNECT, GET_MEMBERS and WATCH of a
group none of the identity's patterns match get ERROR ``forbidden`` (the
connection stays open). Permissions belong to the identity: the union of the
patterns of its tokens, so a token can be rotated by listing old and new under
the same identity. The identity is also what owns an address: another
identity's CONNECT for it gets ``address_in_use`` (the routing table's rule).

Only SHA-256 digests of the tokens are kept in memory and compared; the file
may hold digests instead of tokens (``sha256 = ...``), so it need not be
secret, only tamper-proof.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
import re
import stat
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gossiprouter.core.config import ConfigError
from gossiprouter.core.ratelog import RateLimitedLog
from gossiprouter.ops.access import Backoff, peer_host

# At most one WARNING line per this many seconds about failed authentications (a guessing
# client must not be able to flood the log); the metric counts every one.
FAILURE_LOG_INTERVAL = 10.0

log = logging.getLogger("gossiprouter.ops.auth")

_KEYS = {"identity", "token", "sha256", "groups"}


@dataclass(frozen=True)
class Tokens:
    """A loaded tokens file: token digest -> identity, identity -> its group patterns."""

    by_digest: dict[bytes, str]
    patterns: dict[str, tuple[str, ...]]

    @property
    def identities(self) -> int:
        return len(self.patterns)


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def load_tokens(path: str | Path) -> Tokens:
    """Read and check a tokens file; ConfigError names the entry, key, value and expectation."""
    where = f"tokens_file {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{where}: not found") from None
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it ({e.strerror})") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: not valid TOML ({e})") from None
    unknown = set(raw) - {"token"}
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}; expected [[token]] "
                          "tables only")
    items = raw.get("token", [])
    if not isinstance(items, list):
        raise ConfigError(f"{where}: token = {items!r}: expected an array of tables [[token]]")
    by_digest: dict[bytes, str] = {}
    patterns: dict[str, list[str]] = {}
    plaintext = False
    for i, it in enumerate(items):
        at = f"{where}: token[{i}]"
        if not isinstance(it, dict):
            raise ConfigError(f"{at} = {it!r}: expected a table")
        bad = set(it) - _KEYS
        if bad:
            raise ConfigError(f"{at}.{sorted(bad)[0]}: unknown key; expected "
                              + ", ".join(sorted(_KEYS)))
        ident = it.get("identity")
        if not isinstance(ident, str) or not ident:
            raise ConfigError(f"{at}.identity = {ident!r}: expected a non-empty string")
        d = _token_digest(it, at)
        plaintext = plaintext or "token" in it
        if d in by_digest:
            raise ConfigError(f"{at}: the same token is listed twice")
        groups = it.get("groups", [])
        if not isinstance(groups, list) or not all(isinstance(g, str) and g for g in groups):
            raise ConfigError(f"{at}.groups = {groups!r}: expected a list of group names or "
                              "glob patterns, e.g. [\"billing-*\"]")
        by_digest[d] = ident
        patterns.setdefault(ident, []).extend(groups)
    if plaintext:
        _warn_if_readable(Path(path))
    return Tokens(by_digest, {k: tuple(v) for k, v in patterns.items()})


def _token_digest(it: dict[str, Any], at: str) -> bytes:
    token, hexd = it.get("token"), it.get("sha256")
    if (token is None) == (hexd is None):
        raise ConfigError(f"{at}: expected exactly one of token (the token) or sha256 (its "
                          "SHA-256 in hex)")
    if token is not None:
        if not isinstance(token, str) or len(token) < 16:
            raise ConfigError(f"{at}.token = <hidden>: expected a string of at least 16 "
                              "characters")
        return digest(token)
    if not isinstance(hexd, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", hexd):
        raise ConfigError(f"{at}.sha256 = {hexd!r}: expected 64 hex digits (sha256sum of the "
                          "token)")
    return bytes.fromhex(hexd)


def load_secret(ref: str) -> str:
    """The secret ``ref`` points at: ``file:PATH`` (its first line) or ``env:NAME``.

    ConfigError names the option and what is wrong, never the secret."""
    kind, _, where = ref.partition(":")
    at = f"admin_token = {ref!r}"
    if kind == "env":
        value = os.environ.get(where, "").strip()
        if not value:
            raise ConfigError(f"{at}: environment variable {where} is not set or empty")
    elif kind == "file":
        try:
            lines = Path(where).read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            raise ConfigError(f"{at}: file not found") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{at}: cannot read it ({e})") from None
        value = lines[0].strip() if lines else ""
        if not value:
            raise ConfigError(f"{at}: the file's first line is empty")
    else:
        raise ConfigError(f"{at}: expected file:PATH or env:NAME")
    if len(value) < 16:
        raise ConfigError(f"{at}: expected a token of at least 16 characters")
    return value


def _warn_if_readable(path: Path) -> None:
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if os.name == "posix" and mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning("tokens_file %s holds plain tokens and is readable by others (mode %o); "
                    "chmod 600 it or list sha256 digests instead", path, stat.S_IMODE(mode))


class Authenticator:
    """Answers the native session's two questions: who is this token, may it use that group."""

    def __init__(self, path: str | Path, backoff: float = 0.0) -> None:
        self.path = str(path)
        # Failed HELLOs slow down further HELLOs from the same address (server: Operations).
        self.backoff = Backoff(backoff)
        self._warn = RateLimitedLog(log, FAILURE_LOG_INTERVAL)
        self.tokens = load_tokens(path)
        self._compiled: dict[str, re.Pattern[str]] = {}
        self._compile()
        # reason (unauthorized / forbidden) -> count, for the metrics
        self.failures: dict[str, int] = {"unauthorized": 0, "forbidden": 0}

    def _compile(self) -> None:
        # One regex per identity: a CONNECT costs one match, whatever the number of patterns.
        self._compiled = {
            ident: re.compile("|".join(fnmatch.translate(p) for p in pats) or r"(?!)")
            for ident, pats in self.tokens.patterns.items()
        }

    def reload(self) -> None:
        """Re-read the file; on error keep the current tokens and raise ConfigError.

        Connections already authenticated keep their identity; what their
        identity may use is looked up anew on each request, so a narrowed
        grant takes effect at once.
        """
        self.tokens = load_tokens(self.path)
        self._compile()

    def identify(self, token: str | None, who: object) -> str | None:
        """The identity of ``token``, or None (logged, counted) when it is missing or unknown."""
        ident = None if token is None else self.tokens.by_digest.get(digest(token))
        ip = peer_host(str(getattr(who, "peer", "")))
        if ident is None:
            self.failures["unauthorized"] += 1
            if ip:
                self.backoff.failed(ip, time.monotonic())
            self._warn.warning("refusing %r: %s token", who,
                               "no" if token is None else "unknown")
            return None
        if ip:
            self.backoff.succeeded(ip)
        log.info("%r authenticated as %r", who, ident, extra={"peer": str(who),
                                                               "identity": ident})
        return ident

    def permits(self, identity: str | None, group: str) -> bool:
        """May ``identity`` use ``group``? Refusals are counted and logged."""
        rx = None if identity is None else self._compiled.get(identity)
        if rx is not None and rx.fullmatch(group):
            return True
        self.failures["forbidden"] += 1
        log.info("identity %r may not use group %r (not in its tokens' groups)", identity, group,
                 extra={"identity": identity, "group": group, "reason": "forbidden"})
        return False
