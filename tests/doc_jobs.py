"""Background jobs of the documentation's ``sh`` blocks, for tests/test_doc_snippets.py.

A section of a doc (from one ``#``/``##`` heading to the next) is one terminal. In it:

* a command line ending in ``&`` is a background job, numbered ``%1``, ``%2``, ... in the
  section as bash numbers them. It is waited for before the next command runs: a
  ``gossiprouter listen`` until it says it is listening; anything else until every port of
  the section's own (below) that its line names, in the command or in a comment after it,
  accepts connections. A job whose line names none cannot be waited for, and is an error;
* ``kill [-SIGNAL] %N...`` signals those jobs and waits until they have exited;
* ``<!-- own ports: 1883 12001 -->``, a line of the section: each of these ports, wherever
  it is written in the section (commands, expected output), is a free port of its own;
* a ``text`` block marked on the line before it with ``<!-- output of %N -->`` is what job
  N prints (stdout and stderr, as in the terminal): once the ``sh`` block before it has run,
  the job's output must come to contain those lines, one after the other, where ``...``
  stands for any part of a line and a line of only ``...`` for any lines. The wait ends
  when they are there, when the job has exited, or after WAIT seconds (a failure);
* once the section's last block has run, the jobs still running are stopped with Ctrl-C
  (SIGINT) and must exit 0; a job that exited by itself must have exited 0.

Every process is on 127.0.0.1 and every wait is bounded.
"""

from __future__ import annotations

import re
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tests.procs import free_port, wait_listening

WAIT = 30.0  # seconds: the bound of every wait (a job's start, its output, its exit)
BACKGROUND = re.compile(r"^(?P<cmd>.*[^&\s])\s*(?<!&)&\s*(?:#.*)?$")
KILL = re.compile(r"^kill(?:\s+-(?P<sig>\w+))?(?P<jobs>(?:\s+%\d+)+)\s*(?:#.*)?$")
OWN_PORTS = re.compile(r"^<!-- own ports: (\d+(?: \d+)*) -->$", re.M)
OUTPUT_OF = re.compile(r"^<!-- output of %(\d+) -->$")
LISTENING = "Ctrl-C to stop"  # what `gossiprouter listen` says once it is listening


def expected(text: str) -> re.Pattern[str]:
    """The pattern of an expected-output block: its lines, one after the other, ``...`` any
    part of a line, a line of ``...`` any lines."""
    parts = []
    for line in text.splitlines():
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append("[^\n]*?".join(map(re.escape, line.split("..."))) + r"\n")
    return re.compile("^" + "".join(parts), re.M)


def _signal(name: str | None) -> signal.Signals:
    if name is None:
        return signal.SIGTERM
    if name.isdigit():
        return signal.Signals(int(name))
    return signal.Signals["SIG" + name.upper().removeprefix("SIG")]


@dataclass
class Job:
    number: int
    written: str
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)
    eof: bool = False
    signalled: bool = False  # by a `kill` of the doc: its exit status is its own business

    def read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.eof = True
            self.changed.notify_all()

    def output(self) -> str:
        with self.changed:
            return "".join(self.lines)

    def wait_for(self, pattern: re.Pattern[str] | str, timeout: float = WAIT) -> bool:
        """Until the output matches ``pattern`` (True), or the job's output ended or
        ``timeout`` passed (False)."""
        def seen() -> bool:
            out = "".join(self.lines)
            return (pattern in out) if isinstance(pattern, str) else bool(pattern.search(out))

        with self.changed:
            self.changed.wait_for(lambda: seen() or self.eof, timeout)
            return seen()


class Terminal:
    """The background jobs of one section, and its own ports."""

    def __init__(self, own_ports: tuple[int, ...]) -> None:
        self.ports: dict[int, int] = {}
        for port in own_ports:
            while (free := free_port()) in self.ports.values():
                pass
            self.ports[port] = free
        self.jobs: list[Job] = []

    def substitute(self, text: str) -> str:
        for own, free in self.ports.items():
            text = re.sub(rf"(?<!\d){own}(?!\d)", str(free), text)
        return text

    def job(self, number: int, what: str) -> Job:
        if not 0 < number <= len(self.jobs):
            raise AssertionError(f"{what}: no job %{number} in this section (its earlier "
                                 f"blocks did not run?)")
        return self.jobs[number - 1]

    def start(self, written: str, script: str, *, cwd: Path, env: dict[str, str],
              what: str) -> Job:
        """Start ``script`` (the job's command, substituted, after the prelude) and wait
        until it is ready (see the module docstring)."""
        proc = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        job = Job(len(self.jobs) + 1, written, proc)
        self.jobs.append(job)
        threading.Thread(target=job.read, daemon=True).start()
        if re.match(r"gossiprouter listen\b", written):
            if not job.wait_for(LISTENING):
                raise AssertionError(f"{what}: %{job.number} {written!r} did not start "
                                     f"listening:\n{job.output()}")
            return job
        ports = [free for own, free in self.ports.items()
                 if re.search(rf"(?<!\d){own}(?!\d)", written)]
        if not ports:
            raise AssertionError(f"{what}: {written!r}: a background job must name on its "
                                 f"line one of the section's own ports (<!-- own ports: ... "
                                 f"-->) that it listens on, so the test knows when it is up")
        for port in ports:
            try:
                wait_listening(port, proc, timeout=WAIT)  # type: ignore[arg-type]
            except (RuntimeError, TimeoutError) as e:
                raise AssertionError(f"{what}: %{job.number} {written!r}: {e}\n"
                                     f"{job.output()}") from None
        return job

    def kill(self, sig: str | None, numbers: list[int], what: str) -> None:
        """``kill [-SIG] %N...``: signal the jobs, and wait until they have exited."""
        jobs = [self.job(n, what) for n in numbers]
        for job in jobs:
            job.signalled = True
            if job.proc.poll() is None:
                job.proc.send_signal(_signal(sig))
        for job in jobs:
            try:
                job.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{what}: %{job.number} {job.written!r} still running "
                                     f"{WAIT:g} s after kill") from None

    def expect(self, number: int, text: str, what: str) -> None:
        job = self.job(number, what)
        if not job.wait_for(expected(text)):
            raise AssertionError(
                f"{what}: %{number} {job.written!r} did not print (... = anything):\n{text}\n"
                f"--- it printed:\n{job.output()}")

    def stop(self, what: str) -> None:
        """The end of the section: Ctrl-C for each running job, last started first; each
        must exit 0 (so must a job that exited by itself)."""
        failures = []
        for job in reversed(self.jobs):
            if job.proc.poll() is None:
                job.proc.send_signal(signal.SIGINT)
            try:
                status = job.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                job.proc.kill()
                job.proc.wait()
                failures.append(f"%{job.number} {job.written!r}: still running {WAIT:g} s "
                                f"after Ctrl-C")
                continue
            if status != 0 and not job.signalled:
                failures.append(f"%{job.number} {job.written!r}: exit status {status}\n"
                                f"{job.output()[-2000:]}")
        self.jobs.clear()
        assert not failures, f"{what}: " + "\n".join(failures)

    def kill_all(self) -> None:
        """After a failure: nothing of the section is left running."""
        for job in self.jobs:
            if job.proc.poll() is None:
                job.proc.kill()
                job.proc.wait()
        self.jobs.clear()
