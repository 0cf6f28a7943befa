"""Every command and snippet in README.md and docs/*.md runs as written.

The fenced blocks are extracted and, by their info string:

* ``python``: run in a subprocess (this interpreter), from a scratch copy of the
  repository, against a router this module starts;
* ``sh``: each command run with bash from that scratch copy, against the same router.
  ``gossiprouter serve`` is started on a free port of its own, waited for, and stopped with
  Ctrl-C (SIGINT), which must exit 0; so is ``gossiprouter listen`` once it is listening.
  Every other command must exit 0. ``.``/``source``/``export`` lines carry over to the
  later blocks of the same file, as in one terminal session. README.md runs with nothing
  of the project on PATH (its blocks activate ``.venv`` themselves); docs/ assume an
  installed ``gossiprouter``;
* ``toml``: parsed, and loaded as what it is (router config file, tokens file, load-test
  scenario); ``json``: parsed;
* ``text`` (output, layouts, synopses), ``xml`` (JGroups stacks), ``ini`` (systemd): not run.

A load-test command that an earlier block ran as written, but for the name of its run
directory, is not run a second time (they take minutes on a busy machine).

The only changes made to what is written: port 12001 becomes a free port, and 0.0.0.0
becomes 127.0.0.1 (tests stay on loopback). Nothing is registered behind the reader's back:
a member the commands talk to is one a block starts. A block marked on the line before it
with ``<!-- keeps running: REASON -->`` is a terminal of its own: its ``gossiprouter
listen`` is left running while the file's later blocks run, then stopped with Ctrl-C (exit
0), and must have printed the text of every later ``send`` that was meant for it.

A section (from one heading to the next) is one terminal: a command ending in ``&`` is a
background job (``%1``, ``%2``, ...), waited for until it is up and stopped when the
section's last block has run; ``kill -9 %2`` signals one; the ports a section lists in
``<!-- own ports: 1883 12001 12002 -->`` are free ports of its own; and a ``text`` block
marked ``<!-- output of %N -->`` is what job N must have printed once the ``sh`` block
before it has run (``...`` for what differs from run to run). tests/doc_jobs.py has the
rules; docs/federation.md's quick start uses them.

A ``python`` or ``sh`` block that cannot run in a test (it needs a Spark cluster, root and
/etc, or minutes) is marked on the line before it with ``<!-- not run: REASON -->``; there
are few, and the test keeps them few.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from bisect import bisect
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.doc_jobs import BACKGROUND, KILL, OUTPUT_OF, OWN_PORTS, Terminal, expected
from tests.procs import RouterProcess, free_port, wait_listening

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
NOT_RUN = re.compile(r"^<!-- not run: (\S.*?) -->$")
KEEPS_RUNNING = re.compile(r"^<!-- keeps running: (\S.*?) -->$")
RUN = {"python", "sh"}
CHECKED = {"toml", "json"}
NOT_CODE = {"text", "xml", "ini"}
# Each marked block needs a cluster, a broker elsewhere, /etc or minutes of benchmarks (11 today:
# grep "not run:" README.md docs/*.md); the cap keeps "not run" from becoming the easy way out.
MAX_NOT_RUN = 12
VENV_BIN = str(Path(sys.executable).parent)
PRELUDE = re.compile(r"^(\.|source|export)\s")


@dataclass(frozen=True)
class Block:
    file: Path
    line: int
    lang: str
    body: str
    not_run: str | None
    prelude: tuple[str, ...]  # environment lines from the file's earlier sh blocks
    keeps_running: bool = False  # a terminal of its own (see the module docstring)
    section: int = 0  # the number of headings before it in its file
    own_ports: tuple[int, ...] = ()  # its section's <!-- own ports: ... -->
    outputs: tuple[tuple[int, int, str], ...] = ()  # (job, line, text) of the outputs after it
    ends_section: bool = False  # the last block of its section that runs
    output_of: int | None = None  # a text block: <!-- output of %N -->

    @property
    def id(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def commands(body: str) -> Iterator[str]:
    """The shell commands of a block: continuation lines joined, comment lines dropped."""
    pending = ""
    for raw in body.splitlines():
        line = pending + raw
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        if line.strip() and not line.lstrip().startswith("#"):
            yield line.strip()


def extract() -> list[Block]:
    out = []
    for f in FILES:
        text = f.read_text(encoding="utf-8")
        # Headings and markers outside the fenced blocks (a shell comment is no heading).
        outside = FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
        headings = [m.start() for m in re.finditer(r"^#{1,2} ", outside, re.M)]
        ports: dict[int, tuple[int, ...]] = {}
        for m in OWN_PORTS.finditer(outside):
            ports[bisect(headings, m.start())] = tuple(map(int, m.group(1).split()))
        prelude: list[str] = []
        blocks: list[Block] = []
        for m in FENCE.finditer(text):
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = NOT_RUN.match(before)
            output_of = OUTPUT_OF.match(before)
            lang = m.group(1).strip()
            section = bisect(headings, m.start())
            blocks.append(Block(f, text.count("\n", 0, m.start()) + 1, lang, m.group(2),
                                marker.group(1) if marker else None, tuple(prelude),
                                KEEPS_RUNNING.match(before) is not None, section,
                                ports.get(section, ()),
                                output_of=int(output_of.group(1)) if output_of else None))
            if lang == "sh" and not marker:
                prelude += [c for c in commands(m.group(2)) if PRELUDE.match(c)]
        out += _attach_outputs(blocks)
    return out


def _attach_outputs(blocks: list[Block]) -> list[Block]:
    """Give each sh block the expected outputs that follow it, and mark the last block of
    each section that runs. An output block with no sh block before it in its section keeps
    its ``output_of`` and is reported by test_every_block_says_what_it_is."""
    out: list[Block] = []
    for i, b in enumerate(blocks):
        if b.lang == "sh" and not b.not_run:
            outputs = []
            for later in blocks[i + 1:]:
                if later.lang in RUN or later.section != b.section:
                    break
                if later.output_of is not None:
                    outputs.append((later.output_of, later.line, later.body))
            last = not any(x.lang in RUN and not x.not_run and x.section == b.section
                           for x in blocks[i + 1:])
            b = replace(b, outputs=tuple(outputs), ends_section=last)
        out.append(b)
    return out


BLOCKS = extract()


def _params(langs: set[str]) -> list[object]:
    params: list[object] = []
    for b in BLOCKS:
        if b.lang not in langs or b.not_run:
            continue
        slow = re.search(r"gossiprouter (analyze|loadtest)\b", b.body)
        marks = [pytest.mark.slow, pytest.mark.spark] if slow else []
        params.append(pytest.param(b, id=b.id, marks=marks))
    return params


def test_every_block_says_what_it_is() -> None:
    """A block without a known info string would escape this test, so there are none."""
    assert len(BLOCKS) > 30
    unknown = [(b.id, b.lang) for b in BLOCKS if b.lang not in RUN | CHECKED | NOT_CODE]
    assert not unknown, f"fenced blocks need one of {sorted(RUN | CHECKED | NOT_CODE)}"
    marked = [b for b in BLOCKS if b.not_run]
    assert all(b.lang in RUN for b in marked), [b.id for b in marked if b.lang not in RUN]
    assert 0 < len(marked) <= MAX_NOT_RUN, [b.id for b in marked]
    # A text block is not a disguised command block: no shell prompt lines.
    prompts = [b.id for b in BLOCKS if b.lang == "text" and re.search(r"^\$ ", b.body, re.M)]
    assert not prompts
    # An expected output is a text block that follows an sh block of its section.
    attached = {(b.file, line) for b in BLOCKS for _, line, _ in b.outputs}
    outputs = [b for b in BLOCKS if b.output_of is not None]
    stray = [b.id for b in outputs if b.lang != "text" or (b.file, b.line) not in attached]
    assert not stray, "<!-- output of %N --> marks a text block after an sh block"


def test_extraction_sees_markers_continuations_and_preludes() -> None:
    readme = [b for b in BLOCKS if b.file.name == "README.md"]
    assert readme[0].not_run and "scripts/test" in readme[0].body
    serve = next(b for b in readme if "gossiprouter serve --help" in b.body)
    assert serve.prelude == ()
    tools = next(b for b in readme if "gossiprouter members" in b.body)
    assert {p.split("#")[0].strip() for p in tools.prelude} == {". .venv/bin/activate"}
    assert list(commands("a \\\n  b  # x\n# only a comment\n\nc\n")) == ["a    b  # x", "c"]


def test_background_job_rules(tmp_path: Path) -> None:
    """tests/doc_jobs.py on small cases: what is a job and a kill, what an expected output
    matches (and not), own ports, and a job that names no port it listens on is refused."""
    job = BACKGROUND.match("mosquitto -c m.conf 2> m.log &  # on 127.0.0.1:1883")
    assert job and job["cmd"] == "mosquitto -c m.conf 2> m.log"
    assert not BACKGROUND.match("make && make test") and not BACKGROUND.match("a 2>&1")
    kill = KILL.match("kill -9 %3  # router b")
    assert kill and kill["sig"] == "9" and kill["jobs"].split() == ["%3"]
    kill = KILL.match("kill %5 %4")
    assert kill and kill["sig"] is None and kill["jobs"].split() == ["%5", "%4"]
    assert not KILL.match("kill -9 1234")

    pattern = expected("... join    x (hex:...)\n...\n... leave   x (hex:...)\n")
    assert pattern.search("12:00 members\n12:01 join    x (hex:ab)\nother\n"
                          "12:02 leave   x (hex:ab)\n")
    assert not pattern.search("12:01 join    x (hex:ab)\n")  # the leave is missing
    assert not pattern.search("12:02 leave   x (hex:ab)\n12:01 join    x (hex:ab)\n")  # order
    assert not pattern.search("12:01 join    y (hex:ab)\n12:02 leave   x (hex:ab)\n")
    assert not expected("a...b\n").search("a\nb\n")  # ... in a line stays in the line

    terminal = Terminal((1883, 12001))
    assert len(set(terminal.ports.values())) == 2
    assert terminal.substitute("127.0.0.1:1883 11883 12001") == (
        f"127.0.0.1:{terminal.ports[1883]} 11883 {terminal.ports[12001]}")
    try:
        with pytest.raises(AssertionError, match="must name on its line one of the section"):
            terminal.start("sleep 60 &", "exec sleep 60", cwd=tmp_path, env=dict(os.environ),
                           what="t")
        with pytest.raises(AssertionError, match="no job %2 in this section"):
            terminal.kill("9", [2], "t")
    finally:
        terminal.kill_all()
    assert not terminal.jobs


# --------------------------------------------------------------------------- the world


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    """A router, with nobody in it, and a scratch copy of the repository (symlinks, so that
    what the commands write, such as runs/, lands in a fresh place)."""
    scratch = tmp_path_factory.mktemp("docs-scratch")
    for entry in ROOT.iterdir():
        if entry.name not in ("runs", ".git"):
            (scratch / entry.name).symlink_to(entry)
    with RouterProcess() as router:
        try:
            yield scratch, router.port
        finally:
            for proc, _, _ in KEPT:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for terminal in TERMINALS.values():
                terminal.kill_all()


# The background jobs and own ports of each section, by (file, section) (tests/doc_jobs.py).
TERMINALS: dict[tuple[Path, int], Terminal] = {}

# The listeners of "keeps running" blocks, with their block and command, in file order.
KEPT: list[tuple[subprocess.Popen[str], Block, str]] = []


def _env(block: Block) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    path = [p for p in env.get("PATH", "").split(os.pathsep)
            if p and Path(p).resolve() != Path(VENV_BIN).resolve()]
    if block.file.name != "README.md":  # docs/ assume an installed gossiprouter
        path.insert(0, VENV_BIN)
    env["PATH"] = os.pathsep.join(path)
    return env


def _substitute(text: str, port: int) -> str:
    return text.replace("12001", str(port)).replace("0.0.0.0", "127.0.0.1")


# --------------------------------------------------------------------------- python, toml, json


@pytest.mark.parametrize("block", _params({"python"}))
def test_python_block_runs(block: Block, world: tuple[Path, int]) -> None:
    scratch, port = world
    r = subprocess.run([sys.executable, "-c", _substitute(block.body, port)], cwd=scratch,
                       env=_env(block) | {"PATH": VENV_BIN + os.pathsep + _env(block)["PATH"]},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{block.id} failed:\n{r.stderr[-3000:]}"


@pytest.mark.parametrize("block", _params(CHECKED))
def test_toml_and_json_blocks_load(block: Block, tmp_path: Path) -> None:
    if block.lang == "json":
        json.loads(block.body)
        return
    tomllib.loads(block.body)
    path = tmp_path / "snippet.toml"
    path.write_text(block.body, encoding="utf-8")
    if block.file.name == "loadtest.md":
        from gossiprouter.loadtest.scenario_file import load_scenario

        load_scenario(path)
    elif "[[token]]" in block.body:
        from gossiprouter.ops.auth import load_tokens

        load_tokens(path)
    else:
        from gossiprouter.core.config import load_file

        load_file(path)  # a router config file: every key known, every value valid


# --------------------------------------------------------------------------- sh


def _start(script: str, block: Block, scratch: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(["bash", "-c", script], cwd=scratch, env=_env(block),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _interrupt(proc: subprocess.Popen[str], what: str) -> None:
    """Ctrl-C: the command must stop by itself with status 0."""
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"{what}: still running 30 s after Ctrl-C") from None
    assert proc.returncode == 0, f"{what}: exit status {proc.returncode} after Ctrl-C\n{err}"


def _run_server(cmd: str, script: str, block: Block, scratch: Path) -> None:
    port = int(re.search(r"--port[ =](\d+)", cmd).group(1))  # type: ignore[union-attr]
    proc = _start(script, block, scratch)
    try:
        wait_listening(port, proc, timeout=60)  # type: ignore[arg-type]
    except (RuntimeError, TimeoutError) as e:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"{block.id}: {cmd!r}: {e}\n{err}") from None
    _interrupt(proc, f"{block.id}: {cmd!r}")


def _run_listen(cmd: str, script: str, block: Block, scratch: Path) -> None:
    proc = _start(script, block, scratch)
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    seen = ""
    while "Ctrl-C to stop" not in seen:
        line = proc.stderr.readline()  # the command writes this line, or exits
        if not line or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{block.id}: {cmd!r} did not start listening:\n{seen}")
        seen += line
    if block.keeps_running:
        KEPT.append((proc, block, cmd))  # stopped by test_kept_listeners_got_what_was_sent
        return
    _interrupt(proc, f"{block.id}: {cmd!r}")


# The load-test commands take minutes on a busy machine; one that another block already
# ran as written (but for the name of its run directory) is not run again.
_ALREADY_RAN: set[str] = set()


def _same_as(cmd: str) -> str:
    return re.sub(r"runs/[\w.-]+", "runs/RUN", re.sub(r"\s+#.*$", "", cmd))


@pytest.mark.parametrize("block", _params({"sh"}))
def test_sh_block_runs(block: Block, world: tuple[Path, int]) -> None:
    scratch, router_port = world
    key = (block.file, block.section)
    terminal = TERMINALS.setdefault(key, Terminal(block.own_ports))
    try:
        _run_sh_block(block, scratch, router_port, terminal)
        for number, line, text in block.outputs:
            terminal.expect(number, terminal.substitute(text),
                            f"{block.file.relative_to(ROOT)}:{line}")
        if block.ends_section:
            terminal.stop(block.id)
    except BaseException:
        terminal.kill_all()
        raise
    finally:
        if block.ends_section:
            del TERMINALS[key]


def _run_sh_block(block: Block, scratch: Path, router_port: int, terminal: Terminal) -> None:
    ran = 0
    prelude = list(block.prelude)
    for written in commands(block.body):
        if PRELUDE.match(written):
            prelude.append(written)
            continue
        ran += 1
        if _same_as(written) in _ALREADY_RAN:
            continue
        if kill := KILL.match(written):
            terminal.kill(kill["sig"], [int(n) for n in re.findall(r"%(\d+)", kill["jobs"])],
                          f"{block.id}: {written!r}")
            continue
        if background := BACKGROUND.match(written):
            cmd = _substitute(terminal.substitute(background["cmd"]), router_port)
            terminal.start(written, "\n".join([*prelude, "exec " + cmd]), cwd=scratch,
                           env=_env(block), what=block.id)
            continue
        line = terminal.substitute(written)  # the section's own ports, if it has any
        if re.match(r"(gossiprouter serve|scripts/run)\b", written) and "--help" not in written:
            # A router of its own: never on the port of the one the other commands use.
            own = free_port()
            cmd = _substitute(line, own)
            if "--port" not in cmd:
                cmd = re.sub(r"^(gossiprouter serve|scripts/run)", rf"\1 --port {own}", cmd)
            _run_server(cmd, "\n".join([*prelude, "exec " + cmd]), block, scratch)
        elif written.startswith("gossiprouter listen"):
            cmd = _substitute(line, router_port)
            _run_listen(cmd, "\n".join([*prelude, "exec " + cmd]), block, scratch)
        else:
            cmd = _substitute(line, router_port)
            r = subprocess.run(["bash", "-c", "\n".join([*prelude, cmd])], cwd=scratch,
                               env=_env(block), capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, (
                f"{block.id}: {written!r} exited {r.returncode}\n{r.stdout[-2000:]}\n"
                f"{r.stderr[-2000:]}")
            if re.match(r"gossiprouter (loadtest|analyze)\b", written):
                _ALREADY_RAN.add(_same_as(written))
    assert ran, f"{block.id}: no command in an sh block"


def _sends_for(listener: str, later: list[Block]) -> list[str]:
    """The texts that the ``send`` commands of ``later`` blocks meant for ``listener`` (its
    group; to everyone, or --to its --addr)."""
    words = shlex.split(listener, comments=True)
    group = words[3]
    addr = words[words.index("--addr") + 1] if "--addr" in words else None
    texts = []
    for b in later:
        for c in commands(b.body):
            w = shlex.split(c, comments=True)
            if w[:2] != ["gossiprouter", "send"] or w[3] != group:
                continue
            to = w[w.index("--to") + 1] if "--to" in w else None
            if to is None or to == addr:
                texts.append(w[-1])
    return texts


def test_kept_listeners_got_what_was_sent() -> None:
    """A "keeps running" listener, stopped once its file's blocks have run, printed what
    they sent it (the README's walk-through: listen in one terminal, send from another)."""
    kept = [b for b in BLOCKS if b.keeps_running]
    assert kept, "the README's walk-through keeps a listener running"
    if not KEPT:
        pytest.skip("the blocks that start them did not run (deselected)")
    for proc, block, cmd in KEPT:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, f"{block.id}: {cmd!r}: exit {proc.returncode}\n{err}"
        later = [b for b in BLOCKS if b.file == block.file and b.line > block.line
                 and b.lang == "sh" and not b.not_run]
        texts = _sends_for(cmd, later)
        assert texts, f"{block.id}: no later block sends to {cmd!r}"
        for text in texts:
            assert text in out, f"{block.id}: {cmd!r} did not print {text!r}:\n{out}"
