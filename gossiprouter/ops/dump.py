"""``gossiprouter dump``: print a running router's groups or one group's members.

It reads the router's read-only admin view over HTTP (the ``--metrics``
HOST:PORT), so it needs no credentials on the router port and changes
nothing. Output is a table for people, or the admin view's JSON with ``--json``.
Either way member addresses are printed the way ``gossiprouter send --to`` reads them
(:func:`gossiprouter.core.addresses.format_addr`): the admin view's bare hex would be read back as
text.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

import click

from gossiprouter.core.addresses import format_addr, format_hostport
from gossiprouter.core.cli_errors import CommandError as _Fail
from gossiprouter.core.config import ConfigError
from gossiprouter.core.options import parse_listen
from gossiprouter.ops.auth import load_secret


def fetch(admin: str, group: str | None = None, timeout: float = 5.0,
          token: str = "") -> dict[str, Any]:
    """GET /groups or /groups/GROUP from the admin endpoint ``admin`` (HOST:PORT), every
    page of it (the endpoint answers in bounded pages), merged into one view."""
    view = _get(admin, group, timeout, token, "")
    key = "groups" if group is None else "members"
    while True:
        if group is None and view.get("next") is not None:
            page = _get(admin, None, timeout, token, "?after=" + quote(view["next"], safe=""))
            view["next"] = page.get("next")
        elif group is not None and view.get("next_offset") is not None:
            page = _get(admin, group, timeout, token, f"?offset={view['next_offset']}")
            view["next_offset"] = page.get("next_offset")
        else:
            return view
        view[key] += page[key]


def _get(admin: str, group: str | None, timeout: float, token: str,
         query: str) -> dict[str, Any]:
    try:
        host, port = parse_listen(admin)
    except ValueError as e:
        raise _Fail(f"{admin!r}: {e}") from None
    path = "/groups" if group is None else "/groups/" + quote(group, safe="")
    url = f"http://{format_hostport(host, port)}{path}{query}"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"}
                                 if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data: dict[str, Any] = json.load(r)
            return data
    except urllib.error.HTTPError as e:
        try:
            msg = json.load(e).get("error", e.reason)
        except ValueError:
            msg = e.reason
        raise _Fail(f"{admin}: {msg}") from None
    except urllib.error.URLError as e:
        raise _Fail(f"cannot reach the admin endpoint {admin} ({e.reason}); is the router "
                    "running with --metrics HOST:PORT?") from None
    except (OSError, ValueError) as e:
        raise _Fail(f"{admin}: not a gossiprouter admin endpoint ({e})") from None


def pasteable(view: dict[str, Any]) -> dict[str, Any]:
    """``view`` with each member's ``addr`` (hex in the admin view) in the form
    ``gossiprouter send --to`` reads back: ``hex:abcd``, or plain text when that is the same
    bytes."""
    members = view.get("members")
    if not isinstance(members, list):
        return view
    return {**view, "members": [{**m, "addr": format_addr(bytes.fromhex(m["addr"]))}
                                for m in members]}


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    for r in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def render_groups(view: dict[str, Any]) -> str:
    groups = view.get("groups", [])
    if not groups:
        return "no groups"
    return table([[g["name"], str(g["members"]), str(g["watchers"])] for g in groups],
                 ["GROUP", "MEMBERS", "WATCHERS"])


def render_group(view: dict[str, Any]) -> str:
    title = f"group {view['name']!r}: {len(view['members'])} members, {view['watchers']} watchers"
    if not view["members"]:
        return title
    rows = []
    for m in view["members"]:
        conns = ", ".join(f"{c['peer']} ({c['protocol']}{'' if c['active'] else ', standby'})"
                          for c in m["connections"]) or "-"
        state = []
        if m["sticky"]:
            state.append("sticky")
        if m["grace_remaining"] is not None:
            state.append(f"grace {m['grace_remaining']:.1f}s, {m['held_bytes']} bytes held")
        if m["expires_in"] is not None:
            state.append(f"expires in {m['expires_in']:.1f}s")
        rows.append([m["addr"], m["name"] or "-", " ".join(m["physical"]) or "-", m["kind"],
                     m.get("identity") or "-", conns, ", ".join(state) or "-"])
    return title + "\n" + table(rows, ["ADDR", "NAME", "PHYSICAL", "KIND", "IDENTITY",
                                       "CONNECTIONS", "STATE"])


@click.command()
@click.argument("admin", metavar="HOST:PORT")
@click.argument("group", required=False)
@click.option("--json", "as_json", is_flag=True,
              help="Print the admin view's JSON (member addresses as `send --to` reads them).")
# Typed as every client command's --timeout (gossiprouter.client.cli): seconds, at least 0.1.
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds to wait for the router (connect, answers).")
@click.option("--token", "token_ref", default="", metavar="file:PATH|env:NAME",
              help="Where the endpoint's bearer token is (the router's admin_token).")
def dump(admin: str, group: str | None, as_json: bool, timeout: float,
         token_ref: str) -> None:
    """Print a running router's groups, or the members of GROUP.

    HOST:PORT is the router's --metrics address (its read-only admin view).

    \b
    Examples:
      gossiprouter dump 127.0.0.1:9100            # every group
      gossiprouter dump 127.0.0.1:9100 billing    # members of 'billing'
      gossiprouter dump 127.0.0.1:9100 --json
    """
    try:
        token = load_secret(token_ref) if token_ref else ""
    except ConfigError as e:
        raise _Fail(str(e).replace("admin_token", "--token", 1)) from None
    view = pasteable(fetch(admin, group, timeout, token))
    if as_json:
        click.echo(json.dumps(view, indent=2))
    elif group is None:
        click.echo(render_groups(view))
    else:
        click.echo(render_group(view))
