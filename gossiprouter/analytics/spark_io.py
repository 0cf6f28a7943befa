"""Spark I/O for the analysis: the run directory, local or behind Hadoop's FileSystem API,
and the Spark session it runs in.

Paths are local paths by default. Anything with a URI scheme (``hdfs://``, ``s3a://``,
``file://`` ...) is handed to Spark and Hadoop as is; small files (the manifest, the report)
go through Hadoop's FileSystem API then (:class:`HadoopFs`). :class:`RunStore` is what the jobs
(:mod:`gossiprouter.analytics.audit`, :mod:`gossiprouter.analytics.topics_audit`) read and
write through. :func:`spark_session` starts Spark, embedded as ``local[*]`` unless a master
URL is given, kept on loopback for a loopback master (the jobs start it through
:mod:`gossiprouter.analytics.session`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlparse

from gossiprouter.analytics.jvm_archive import class_archive, finish_archive, track
from gossiprouter.loadtest.records import (
    MANIFEST_FILE,
    MEMBERSHIP_FILE,
    MEMBERSHIP_SCHEMA,
    RECORD_SCHEMA,
    RECORDS_DIR,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["APP_NAME", "DEFAULT_MASTER", "DRIVER_JAVA_OPTIONS", "LOCAL_COLLECTOR", "LOOPBACK",
           "MASTER_CONNECT_TIMEOUT", "AuditInputError", "HadoopFs", "RunStore",
           "SparkStartError", "check_java", "check_local_dir", "check_run_dir",
           "chooses_collector", "ddl", "driver_address", "java_binary", "local_frame",
           "local_path", "loopback_master", "rows", "session_settings", "spark_session",
           "stop_session"]

DEFAULT_MASTER: Final = "local[*]"
APP_NAME: Final = "gossiprouter-analyze"
# The Spark setting that holds the driver JVM's options (the collector, the class archive and a
# small run's compiler settings all go there).
DRIVER_JAVA_OPTIONS: Final = "spark.driver.extraJavaOptions"

# The garbage collector of a local master's driver JVM, which runs the tasks itself. The
# throughput collector, not G1 (Java's default): on a machine of few cores G1's concurrent
# threads and costlier write barriers take the tasks' cores. Measured on 2 cores, whole
# analyses alternating (docs/performance-spark.md, sixth pass): 10.6 M records 0.81 and 0.86
# of G1's time, 1.5 M records 42-52 s against 58-61 s; a 14,400-record run within the noise.
# Left out when the options or the JVM's environment choose a collector
# (:func:`chooses_collector`).
LOCAL_COLLECTOR: Final = "-XX:+UseParallelGC"
_COLLECTOR: Final = re.compile(r"-XX:\+Use\w+GC\b")
_JVM_ENVIRONMENT: Final = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")
_SPARK_TYPES: Final = {"string": "STRING", "int64": "BIGINT", "int32": "INT"}


class AuditInputError(Exception):
    """The run directory is missing or does not hold what the analysis needs."""


class SparkStartError(Exception):
    """Spark could not start (the master is unreachable, say); the message is one line."""


# How long to wait for a TCP connection to a standalone master before giving up: Spark's
# own client would retry for about a minute and then report only a stopped SparkContext.
MASTER_CONNECT_TIMEOUT: Final = 5.0
LOOPBACK: Final = "127.0.0.1"


def ddl(schema: pa.Schema) -> str:
    # The reader's schema is derived from the writer's, so the two cannot drift apart; giving
    # Spark the schema also spares it inferring one from every file's footer.
    return ", ".join(f"`{f.name}` {_SPARK_TYPES[str(f.type)]}" for f in schema)


# ---------------------------------------------------------------------------------------------
# Paths: local paths or Hadoop-compatible URIs


def _is_uri(path: str) -> bool:
    # One-letter schemes are Windows drive letters, not URIs.
    return len(urlparse(path).scheme) > 1


def local_path(path: str) -> Path | None:
    """The local filesystem path for ``path``, or None when it is a non-file URI."""
    if not _is_uri(path):
        return Path(path)
    parsed = urlparse(path)
    return Path(parsed.path) if parsed.scheme == "file" else None


def spark_uri(path: str) -> str:
    # A bare path would be resolved against Hadoop's fs.defaultFS (HDFS on many clusters);
    # an explicit file: URI keeps "local path" meaning local path.
    local = local_path(path)
    if local is not None and not _is_uri(path):
        return "file://" + os.path.abspath(local)
    return path


def join_uri(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def _visible_parquet(names: Iterable[str]) -> bool:
    return any(n.endswith(".parquet") and not n.startswith((".", "_")) for n in names)


def check_run_dir(run_dir: str) -> None:
    """Raise :class:`AuditInputError` unless the (local) ``run_dir`` holds records and a
    membership timeline; URIs are checked later, through Spark."""
    local = local_path(run_dir)
    if local is not None:
        _check_local_inputs(local)


def check_local_dir(run_dir: Path) -> None:
    """Raise :class:`AuditInputError` unless ``run_dir`` is a directory, saying which it is
    not (missing, or a file)."""
    if not run_dir.is_dir():
        why = "is not a directory" if run_dir.exists() else "does not exist"
        raise AuditInputError(f"run directory {run_dir} {why}")


def _check_local_inputs(run_dir: Path) -> None:
    check_local_dir(run_dir)
    records = run_dir / RECORDS_DIR
    if not records.is_dir() or not _visible_parquet(p.name for p in records.iterdir()):
        raise AuditInputError(f"no records in {run_dir} (expected {records}/*.parquet)")
    if not (run_dir / MEMBERSHIP_FILE).exists():
        raise AuditInputError(f"no membership timeline {run_dir / MEMBERSHIP_FILE}")


class HadoopFs:
    """The few filesystem operations the job needs, through Hadoop's FileSystem API."""

    def __init__(self, spark: SparkSession) -> None:
        sc: Any = spark.sparkContext
        self._jvm: Any = sc._jvm
        self._conf: Any = sc._jsc.hadoopConfiguration()

    def _fs(self, uri: str) -> tuple[Any, Any]:
        path = self._jvm.org.apache.hadoop.fs.Path(uri)
        return path.getFileSystem(self._conf), path

    def exists(self, uri: str) -> bool:
        fs, path = self._fs(uri)
        return bool(fs.exists(path))

    def names(self, uri: str) -> list[str]:
        fs, path = self._fs(uri)
        return [str(s.getPath().getName()) for s in fs.listStatus(path)]

    def read_bytes(self, uri: str) -> bytes:
        fs, path = self._fs(uri)
        stream = fs.open(path)
        try:
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def write_bytes(self, uri: str, data: bytes) -> None:
        fs, path = self._fs(uri)
        out = fs.create(path, True)
        try:
            out.write(bytearray(data))
        finally:
            out.close()


def check_remote_inputs(fs: HadoopFs, run_uri: str) -> None:
    if not fs.exists(run_uri):
        raise AuditInputError(f"run directory {run_uri} does not exist")
    records = join_uri(run_uri, RECORDS_DIR)
    if not fs.exists(records) or not _visible_parquet(fs.names(records)):
        raise AuditInputError(f"no records in {run_uri} (expected {records}/*.parquet)")
    if not fs.exists(join_uri(run_uri, MEMBERSHIP_FILE)):
        raise AuditInputError(f"no membership timeline {join_uri(run_uri, MEMBERSHIP_FILE)}")


# ---------------------------------------------------------------------------------------------
# Spark session


def _local_cores(master: str) -> int | None:
    """Worker threads of a ``local``/``local[N]``/``local[*]`` master; None for a cluster."""
    m = re.fullmatch(r"local(?:\[(\*|\d+)(?:\s*,\s*\d+)?\])?", master.strip())
    if m is None:
        return None
    if m.group(1) is None:
        return 1
    return (os.cpu_count() or 1) if m.group(1) == "*" else int(m.group(1))


def _master_hosts(master: str) -> list[tuple[str, int]] | None:
    """(host, port) of each master of a ``spark://h1:p1,h2:p2`` URL; None for other URLs."""
    if not master.startswith("spark://"):
        return None
    out: list[tuple[str, int]] = []
    for part in master[len("spark://"):].split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not port.isdigit():
            host, port = part.strip(), "7077"
        out.append((host.strip("[]"), int(port)))
    return out


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_master(master: str) -> bool:
    """True for a local master, or a standalone master whose every host is on loopback:
    then the driver must bind and advertise a loopback address too."""
    if _local_cores(master) is not None:
        return True
    hosts = _master_hosts(master)
    return bool(hosts) and all(_is_loopback(h) for h, _ in hosts or ())


def _check_masters_reachable(master: str, timeout: float = MASTER_CONNECT_TIMEOUT) -> None:
    """Raise :class:`SparkStartError` unless a master of a ``spark://`` URL accepts a TCP
    connection within ``timeout`` seconds."""
    hosts = _master_hosts(master)
    if not hosts:
        return
    errors: list[str] = []
    for host, port in hosts:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except TimeoutError:
            errors.append(f"{host}:{port}: no answer within {timeout:g} s")
        except OSError as e:
            errors.append(f"{host}:{port}: {e.strerror or e}")
    raise SparkStartError(f"cannot reach the Spark master {master} ({'; '.join(errors)})")


def _log_cause(log_path: str | os.PathLike[str] | None) -> str | None:
    """The most telling line of Spark's log: the last ERROR line (such as "All masters are
    unresponsive! Giving up."), without its timestamp and logger prefix, or the message of
    the exception that ended the JVM ("Master must either be yarn or start with ...")."""
    if log_path is None:
        return None
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 200_000))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        m = re.search(r"\bERROR\b\s*(?:[\w.$]+:\s*)?(.*)", line)
        if m is None:
            m = re.match(r'Exception in thread "[^"]*" [\w.$]+:\s*(.*)', line)
        if m and m.group(1).strip():
            return m.group(1).strip()
    return None


MIN_JAVA: Final = 17


def java_binary() -> str | None:
    """The Java Spark's launcher runs: ``$JAVA_HOME/bin/java``, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    return os.path.join(home, "bin", "java") if home else shutil.which("java")


def check_java() -> None:
    """Raise :class:`SparkStartError` unless the Java Spark would run (``$JAVA_HOME/bin/java``,
    else ``java`` on PATH, as Spark's launcher picks it) is there and is Java 17 or newer;
    PySpark's own report of a missing Java is "Java gateway process exited". Checked once
    per process and Java."""
    java = java_binary()
    if java is not None and java in _JAVA_CHECKED:
        return
    home = os.environ.get("JAVA_HOME")
    advice = "install a JDK or set JAVA_HOME"
    if java is None:
        raise SparkStartError(f"Java {MIN_JAVA}+ not found: {advice}")
    if home and not os.access(java, os.X_OK):
        raise SparkStartError(f"Java {MIN_JAVA}+ not found: JAVA_HOME={home} has no "
                              f"bin/java ({advice})")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60,
                             check=False).stderr
    except (OSError, subprocess.SubprocessError) as e:
        raise SparkStartError(f"Java {MIN_JAVA}+ not found: {java} does not run ({e}; "
                              f"{advice})") from None
    m = re.search(r'version "(?:1\.)?(\d+)', out)
    if m is not None and int(m.group(1)) < MIN_JAVA:
        raise SparkStartError(f"Java {MIN_JAVA}+ not found: {java} is Java {m.group(1)} "
                              f"({advice} of a newer one)")
    _JAVA_CHECKED.add(java)


_JAVA_CHECKED: set[str] = set()  # the Java binaries check_java found good


def driver_address(spark: SparkSession) -> str:
    """host:port the driver advertises to the executors."""
    conf: Any = spark.sparkContext.getConf()
    return f"{conf.get('spark.driver.host', '?')}:{conf.get('spark.driver.port', '?')}"


def _quiet_python_warnings() -> None:
    # PySpark warns about pandas versions it has not certified; this job never converts to
    # pandas, so the warning is noise in the terminal summary.
    warnings.filterwarnings("ignore", message=".*PySpark does not yet fully support pandas.*")


def spark_session(
    master: str | None = None,
    *,
    conf: Mapping[str, str] | None = None,
    log_path: str | os.PathLike[str] | None = None,
    share_classes: str | None = None,
) -> SparkSession:
    """Start (or join) the Spark session the analysis runs in.

    ``master`` defaults to ``local[*]``. For local masters, and standalone masters on
    loopback (``spark://127.0.0.1:7077``), the driver binds to and advertises 127.0.0.1 only
    (and ``SPARK_LOCAL_IP`` defaults to 127.0.0.1), so nothing leaves loopback; on a real
    cluster Spark picks the address, and ``spark.driver.host`` in ``conf`` sets it. The web
    UI is off and local shuffles use 2 partitions per core. ``conf`` entries are applied
    last and win. With ``log_path`` the JVM's stdout and stderr (Spark's own log lines at
    WARN and above) go to that file instead of the terminal; without it only errors are
    logged. If a SparkContext is already running in this process it is reused as it is.
    ``share_classes``: a new JVM maps (or writes) the class archive of that kind
    (jvm_archive: ``jvm_archive.ANALYSIS`` for ``analyze``); stop the session with
    :func:`stop_session` then. A ``spark://`` master that accepts no TCP
    connection within :data:`MASTER_CONNECT_TIMEOUT` seconds, or a context that Spark
    stopped while starting (it gave up registering with the master), raises
    :class:`SparkStartError` with the cause on one line.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    _quiet_python_warnings()
    master = master or DEFAULT_MASTER
    # Checked even when a context is running (and would be joined): asking for an
    # unreachable master is a mistake worth hearing about, and it costs no JVM.
    _check_masters_reachable(master)
    if SparkContext._active_spark_context is not None:
        return SparkSession.builder.getOrCreate()

    check_java()
    settings = session_settings(master, conf, log_to_file=log_path is not None)
    if settings.get("spark.driver.bindAddress") == LOOPBACK:
        # The environment variable covers the services that do not read bindAddress.
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    spark_conf = SparkConf().setMaster(master).setAll(list(settings.items()))
    return SparkSession(_start_context(master, spark_conf, log_path, share_classes))


def session_settings(master: str, conf: Mapping[str, str] | None = None, *,
                     log_to_file: bool = False) -> dict[str, str]:
    """The Spark configuration :func:`spark_session` starts a context with: ``conf`` over
    the defaults, and for a local master :data:`LOCAL_COLLECTOR` added to the driver's JVM
    options unless a collector is chosen already."""
    settings: dict[str, str] = {
        "spark.app.name": APP_NAME,
        "spark.ui.enabled": "false",
        # The console progress bar would draw over the terminal (or fill the log file).
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": "WARN" if log_to_file else "ERROR",
        # PySpark's "DataFrame debugging": every Column operation records its Python call
        # site in the JVM for error messages, 11 Py4J round trips instead of 1 to 3 (F.col:
        # 13). A small run's analysis made 4,500 round trips with it, 2,480 without.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
    }
    if loopback_master(master):
        # A run on loopback must not listen beyond it, nor make the executors connect back
        # to an external address (Spark's default is the first external interface).
        settings.update({"spark.driver.bindAddress": LOOPBACK, "spark.driver.host": LOOPBACK})
    cores = _local_cores(master)
    if cores is not None:
        settings.update({
            # The default of 200 partitions is far too many for a handful of cores.
            "spark.sql.shuffle.partitions": str(2 * cores),
            "spark.default.parallelism": str(2 * cores),
        })
        if "SPARK_DRIVER_MEMORY" not in os.environ:
            # In local mode the driver JVM is also the executor; the 1 GiB default makes
            # tens of millions of records spill heavily.
            settings["spark.driver.memory"] = "3g"
    settings.update(conf or {})
    if cores is not None:
        options = settings.get(DRIVER_JAVA_OPTIONS, "")
        if not chooses_collector(options, os.environ):
            settings[DRIVER_JAVA_OPTIONS] = _more_options(options, LOCAL_COLLECTOR)
    return settings


def _more_options(options: str | None, more: str) -> str:
    """The JVM options ``options`` (None or empty: none) with ``more`` after them: the caller's
    own come first, and none is lost."""
    return f"{options or ''} {more}".strip()


def chooses_collector(options: str, environ: Mapping[str, str]) -> bool:
    """Whether the JVM options ``options``, or those the JVM reads from ``environ``
    (``JAVA_TOOL_OPTIONS``, ``JDK_JAVA_OPTIONS``, ``_JAVA_OPTIONS``), choose a garbage
    collector: :data:`LOCAL_COLLECTOR` is then left out (two choices stop the JVM)."""
    return any(_COLLECTOR.search(text) for text in
               (options, *(environ.get(v, "") for v in _JVM_ENVIRONMENT)))


def _start_context(master: str, spark_conf: Any, log_path: str | os.PathLike[str] | None,
                   share_classes: str | None) -> Any:
    from pyspark import SparkContext
    from pyspark.errors import PySparkException
    from pyspark.find_spark_home import _find_spark_home
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        # (A JVM left by an earlier, stopped context is reused; its output stays where it was.)
        sc = SparkContext(conf=spark_conf)
    else:
        java = java_binary()
        archive = (class_archive(java, _find_spark_home(), kind=share_classes)
                   if share_classes is not None and java is not None else None)
        if archive is not None:  # the JVM's class archive (jvm_archive): mapped or written
            spark_conf.set(DRIVER_JAVA_OPTIONS,
                           _more_options(spark_conf.get(DRIVER_JAVA_OPTIONS), archive.options))
        launch: Any = launch_gateway  # untyped in PySpark
        with contextlib.ExitStack() as stack:
            kwargs = None
            if log_path is not None:
                # The JVM inherits the file; it keeps writing there after we close ours.
                log = stack.enter_context(open(log_path, "ab"))
                kwargs = {"stdout": log, "stderr": log}
            try:
                gateway = launch(spark_conf, popen_kwargs=kwargs)
            except PySparkException as e:
                # "Java gateway process exited": the JVM's own reason is in the log.
                cause = _log_cause(log_path)
                if cause is None:
                    raise
                raise SparkStartError(f"Spark could not start on {master}: {cause}") from e
        if archive is not None:
            track(gateway, archive)
        sc = SparkContext(conf=spark_conf, gateway=gateway)
    jsc: Any = sc._jsc
    if jsc.sc().isStopped():
        # Spark gives up registering with an unresponsive master by stopping the context;
        # what came next would fail with "Cannot call methods on a stopped SparkContext".
        cause = _log_cause(log_path) or "Spark stopped the context while starting"
        stop_session(sc)
        raise SparkStartError(f"Spark could not start on {master}: {cause}")
    return sc


def stop_session(spark: SparkSession | Any, saving: Callable[[], None] | None = None,
                 stop: bool = True) -> None:
    """Stop ``spark`` (a session or a context; not with ``stop=False``: the process ends);
    if its JVM writes the class archive, end the JVM and keep the archive (calling
    ``saving`` first: to say why the wait)."""
    from pyspark import SparkContext

    if stop:
        spark.stop()
    if finish_archive(SparkContext._gateway, saving):
        SparkContext._gateway = None  # the next session starts a new JVM
        SparkContext._jvm = None


def local_frame(spark: SparkSession, data: Iterable[Sequence[Any]], schema: str) -> DataFrame:
    """A small DataFrame of the Python rows ``data`` (columns as in the DDL ``schema``),
    built in the JVM from one JSON literal: createDataFrame of a list would start a Python
    worker process to unpickle it (about a second at a cold start)."""
    from pyspark.sql import functions as F

    names = [c.strip().split()[0].strip("`") for c in schema.split(",")]
    fields = ", ".join(f"`{n}`: {c.strip().split(None, 1)[1]}"
                       for n, c in zip(names, schema.split(","), strict=True))
    text = json.dumps([dict(zip(names, r, strict=True)) for r in data])
    return spark.range(1).select(F.inline(F.from_json(F.lit(text),
                                                      f"array<struct<{fields}>>")))


def rows(df: DataFrame) -> list[dict[str, Any]]:
    """Collect ``df`` (a small aggregate) as a list of plain dicts."""
    return [r.asDict() for r in df.collect()]


# ---------------------------------------------------------------------------------------------
# The run directory, as the job reads and writes it


class RunStore:
    """The run directory (and report files) of one analysis, local or through Hadoop."""

    def __init__(self, spark: SparkSession, run_dir: str) -> None:
        self.spark = spark
        self.run_dir = run_dir
        self.run_uri = spark_uri(run_dir)
        self._fs: HadoopFs | None = None

    @property
    def fs(self) -> HadoopFs:
        if self._fs is None:
            self._fs = HadoopFs(self.spark)
        return self._fs

    def check_inputs(self) -> None:
        """Raise :class:`AuditInputError` unless a remote run directory holds the inputs
        (a local one was checked by :func:`check_run_dir` before Spark started)."""
        if local_path(self.run_dir) is None:
            check_remote_inputs(self.fs, self.run_uri)

    def manifest(self, warnings: list[str]) -> dict[str, Any] | None:
        """The run's manifest, or None (with a line in ``warnings``) when it is missing or
        unreadable: the analysis goes on without it."""
        try:
            raw = self.read_bytes(MANIFEST_FILE)
            if raw is None:
                warnings.append(f"no {MANIFEST_FILE} in the run directory")
                return None
            data = json.loads(raw)
        except (OSError, ValueError) as e:
            warnings.append(f"{MANIFEST_FILE} unreadable: {e}")
            return None
        if not isinstance(data, dict):
            warnings.append(f"{MANIFEST_FILE} is not a JSON object; kept under 'value'")
            return {"value": data}
        return data

    def read_bytes(self, name: str) -> bytes | None:
        """The small file ``name`` of the run directory (the manifest), None when there is
        none; OSError when it cannot be read."""
        local = local_path(self.run_dir)
        if local is not None:
            path = local / name
            return path.read_bytes() if path.exists() else None
        uri = join_uri(self.run_uri, name)
        return self.fs.read_bytes(uri) if self.fs.exists(uri) else None

    def table(self, name: str, schema: pa.Schema) -> DataFrame:
        """The Parquet file or directory ``name`` of the run directory, read with its
        writer's ``schema``."""
        return self.spark.read.schema(ddl(schema)).parquet(join_uri(self.run_uri, name))

    def timeline(self) -> DataFrame:
        """The membership timeline, with the writer's schema."""
        return self.table(MEMBERSHIP_FILE, MEMBERSHIP_SCHEMA)

    def records(self) -> DataFrame:
        """Every delivery and send record, with the writer's schema."""
        return self.table(RECORDS_DIR, RECORD_SCHEMA)

    def write(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` (a local path or a URI), creating local parents."""
        local = local_path(path)
        if local is not None:
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(data)
        else:
            self.fs.write_bytes(path, data)
