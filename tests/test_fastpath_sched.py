"""The fast path's threads scheduled as SCHED_BATCH (``fast_path_sched``, issue 30's light load).

A thread woken by a sender's write on this machine preempted the sender, and the receiver it
wrote to preempted it in turn: a context switch more per message. As SCHED_BATCH the relay
thread and the busy connections' threads wait for the running thread to sleep instead
(docs/performance.md). These tests read each thread's policy from the kernel
(``os.sched_getscheduler`` of its thread id), and make the kernel refuse it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gossiprouter.core.config import Config, ConfigError
from gossiprouter.server import fastpath
from tests.test_fastpath import Start
from tests.test_fastpath_workers import Net
from tests.test_ops_metrics import scrape

CAP_SYS_NICE = 23


def batch_threads() -> int:
    """This process's threads whose policy is SCHED_BATCH."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            n += os.sched_getscheduler(int(tid)) == os.SCHED_BATCH
    return n


@contextlib.contextmanager
def started(threads: int, batch: bool = False) -> Iterator[Net]:
    net = Net(threads=threads, batch=batch)
    try:
        yield net
    finally:
        net.close()


def test_the_relay_thread_and_the_workers_run_as_batch() -> None:
    assert batch_threads() == 0
    with started(threads=2, batch=True) as net:
        assert batch_threads() == 1  # the relay thread, set before start() returned
        info = net.info()
        assert (info["batch"], info["sched_refused"]) == (1, 0)
        a = net.sender(b"A")
        net.one_by_one(a, 0, 5)  # its first read promotes it: a worker starts
        assert net.info()["workers"] == 1
        assert batch_threads() == 2
    assert batch_threads() == 0  # stopped: both threads ended


def test_without_batch_the_threads_keep_the_default_policy() -> None:
    with started(threads=2) as net:
        a = net.sender(b"A")
        net.one_by_one(a, 0, 5)
        assert (net.info()["workers"], net.info()["batch"]) == (1, 0)
        assert batch_threads() == 0


def _refused_relay(out: dict[str, Any]) -> None:
    """In a thread of its own: SCHED_IDLE, and CAP_SYS_NICE dropped (capabilities and policy
    are per thread, and a new thread inherits both): leaving SCHED_IDLE for SCHED_BATCH then
    needs an RLIMIT_NICE this process does not have, so the relay thread is refused."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        libc = ctypes.CDLL(None, use_errno=True)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
        data = (ctypes.c_uint32 * 6)()  # two of (effective, permitted, inheritable)
        assert libc.capget(header, data) == 0
        data[0] &= ~(1 << CAP_SYS_NICE)
        assert libc.capset(header, data) == 0
        mod = fastpath._relay
        assert mod is not None
        relay = mod.Relay(batch=True)
        relay.start()
        out["info"] = relay.info()
        relay.stop()
    except BaseException as e:  # reported by the test
        out["error"] = e


def test_a_refused_policy_is_reported_and_the_relay_runs_on() -> None:
    out: dict[str, Any] = {}
    t = threading.Thread(target=_refused_relay, args=(out,))
    t.start()
    t.join(60)
    assert "error" not in out, out.get("error")
    assert out["info"]["sched_refused"] == errno.EPERM
    assert out["info"]["batch"] == 1


def test_the_setting() -> None:
    assert Config().fast_path_sched == "batch"
    with pytest.raises(ConfigError, match=r"fast_path_sched = 'fifo': expected one of batch, "
                       r"normal"):
        Config(fast_path_sched="fifo")
    ok, text = fastpath.status(Config(fast_path="on", fast_path_sched="normal"))
    assert ok and text.endswith("; scheduled normal)"), text


async def test_the_router_runs_its_relay_thread_as_configured(start_router: Start,
                                                              caplog: Any) -> None:
    caplog.set_level(logging.WARNING)
    router = await start_router(fast_path="on", fast_path_sched="batch", metrics="127.0.0.1:0")
    assert batch_threads() == 1
    samples = await scrape(router)
    [settings] = [dict(labels) for name, labels in samples
                  if name == "gossiprouter_settings_info"]
    assert settings["fast_path_sched"] == "batch"
    assert "refused" not in caplog.text
    await start_router(fast_path="on", fast_path_sched="normal")
    assert batch_threads() == 1  # the second router's relay thread is not one
