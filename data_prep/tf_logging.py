"""TensorFlow imported without its start-up noise; TF_CPP_MIN_LOG_LEVEL=0 shows it all.

TensorFlow 2.21's C++ libraries print, before absl's logging is initialised and so
whatever TF_CPP_MIN_LOG_LEVEL says, per library loaded (twice per process):

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 ... port.cc:153] oneDNN custom operations are on. ...
    I0000 ... cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.

and, at the first device query of a machine with CUDA libraries but no usable GPU,
`E0000 ... cuda_platform.cc:52] failed call to cuInit: ... (303)`. A tool's --help printed
seven such lines; the demo's log 113.

`import_tensorflow()` imports TensorFlow and queries its GPUs with file descriptor 2
pointed at a temporary file, then writes back every line except the notices above that
the log level hides: glog-style lines below TF_CPP_MIN_LOG_LEVEL (2, warnings and info
hidden, unless the environment sets it), absl's pre-initialisation banner, and the cuInit
error when no GPU was found (TensorFlow then runs on the CPU, as the line before it says).
Everything else (Python warnings, real errors) comes back unchanged, in order. absl's
Python logging has the same prefix (`I1127 10:20:36.51 4242 loop.py:88] ...`):
`python_log_message` picks a program's own lines out by file name (scripts/quickstart.py
shows its tools' progress that way). With
TF_CPP_MIN_LOG_LEVEL=0 nothing is filtered. The tools' packages call it before anything
imports TensorFlow; once TensorFlow is imported it does nothing.

TensorFlow logs one more notice as an error, once per process, at the first int64 op its
oneDNN kernels decline (`oneDNN supports DT_INT64 only on platforms with AVX-512`, on
every CPU): `import_tensorflow()` spends it while stderr is captured (see
`_spend_onednn_dtype_notice`), so `import bert_keras` in a user's script hides it too.

It also turns on TensorFlow's oneDNN kernels on x86-64 CPUs where TensorFlow leaves them
off. TensorFlow 2.21 enables them by default only on CPUs with AVX-512 VNNI, BF16 or AMX;
on an AVX2-only CPU (an AMD EPYC Milan here) it runs Eigen's kernels. There the POS
fine-tuning benchmark trained at 18.7 examples/s against 21.7 with oneDNN: 1.11x
transformers' speed instead of 1.29x (torch uses oneDNN on every x86 CPU; BUILD_NOTES.md,
section 8.5). The environment decides when it says anything: TF_ENABLE_ONEDNN_OPTS=0 keeps
them off, and a process that imported TensorFlow first keeps TensorFlow's choice.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import platform
import re
import sys
import tempfile
from typing import Collection, Iterator

LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
DEFAULT_LEVEL = "2"  # hide TensorFlow's C++ info and warnings; errors stay
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"

_BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# glog / absl C++ prefix: severity letter, MMDD, time (before absl is initialised
# "00:00:<seconds since 1970>"), thread id, file:line]
_GLOG = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ ([^ \]]+):\d+\] ")
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
_NOT_AN_ERROR = "oneDNN supports DT_INT64 only on platforms with AVX-512"


def keep_line(line: str, level: int, gpus_found: bool) -> bool:
    """Whether a line TensorFlow's import wrote to stderr is shown at `level`."""
    if level <= 0:
        return True
    if line.rstrip("\n") == _BANNER:
        return False
    match = _GLOG.match(line)
    if not match:
        return True
    severity = _SEVERITY[match.group(1)]
    if severity == 2 and "failed call to cuInit" in line and not gpus_found and level >= 2:
        return False
    # A notice logged as an error at the first int64 op on CPUs without AVX-512 (the op
    # then runs on Eigen, as always before oneDNN): scripts/quickstart.py filters its tools'
    # stderr with this function.
    if severity == 2 and _NOT_AN_ERROR in line and level >= 2:
        return False
    return severity >= level


def is_log_line(line: str) -> bool:
    """Whether a line starts like a glog / absl log record (`I1127 10:20:36.51 4242 x.cc:9] `)."""
    return _GLOG.match(line) is not None


def python_log_message(line: str, modules: Collection[str]) -> str | None:
    """A line of absl's Python logging from one of `modules` (file names: `I1127
    10:20:36.512345 4242 loop.py:88] step 50/60 ...` with "loop.py" in them) without its
    prefix, warnings and errors marked (`warning: ...`); None for any other line
    (TensorFlow's C++ log and its Python modules' log, which share the prefix, plain
    output)."""
    match = _GLOG.match(line)
    if not match or match.group(2) not in modules:
        return None
    mark = {"I": "", "W": "warning: ", "E": "error: ", "F": "fatal: "}[match.group(1)]
    return mark + line[match.end():]


def onednn_default(machine: str | None = None) -> str | None:
    """The TF_ENABLE_ONEDNN_OPTS value to default to on this machine: "1" on x86-64 (the
    oneDNN kernels TensorFlow ships for it), None elsewhere (TensorFlow decides)."""
    machine = (machine or platform.machine()).lower()
    return "1" if machine in ("x86_64", "amd64") else None


def log_level() -> int:
    """TF_CPP_MIN_LOG_LEVEL as a number (2, the default here, when unset or not a number)."""
    try:
        return int(os.environ.get(LEVEL_ENV, DEFAULT_LEVEL))
    except ValueError:
        return int(DEFAULT_LEVEL)


@contextlib.contextmanager
def python_info_hidden() -> Iterator[None]:
    """Hides the INFO records TensorFlow's (and JAX's) own Python code logs inside the block.

    tf.saved_model.save logs notes for TensorFlow's developers at INFO, which the tools
    show (absl's app.run logs at INFO): `Function `serve` contains input name(s) ... with
    unsupported characters which will be renamed ...` per signature, `Sharding callback
    duration`, `Writing fingerprint`, and `Assets written to` twice; an export printed a
    dozen such lines around its own two. Some come through TensorFlow's logger, most
    through absl's, which the tools log with too, so a filter on both drops the INFO
    records of TensorFlow's source files only: warnings and errors always pass, and
    TF_CPP_MIN_LOG_LEVEL=0 (every TensorFlow notice, as at import) keeps them all. Every
    tool runs inside it (`data_prep.cli.report_errors`): tf.distribute logs such notes too,
    each twice (TensorFlow's handler and absl's), 22 lines for a 2-replica
    MirroredStrategy run of run_pretraining.
    """
    spec = importlib.util.find_spec("tensorflow")
    if log_level() <= 0 or spec is None:  # every notice asked for, or no TensorFlow at all
        yield
        return
    tensorflow_dir = os.path.abspath(spec.submodule_search_locations[0]) + os.sep

    def shown(record: logging.LogRecord) -> bool:
        return (record.levelno >= logging.WARNING
                or not os.path.abspath(record.pathname).startswith(tensorflow_dir))

    loggers = [logging.getLogger("tensorflow"), logging.getLogger("absl")]
    for logger in loggers:
        logger.addFilter(shown)
    # JAX logs its notes through loggers of its own (`Unable to initialize backend 'tpu':
    # INTERNAL: Failed to open libtpu.so` in every JAX run on a machine without a TPU, its
    # distributed service's addresses): a level on their parent keeps its INFO out too.
    jax_logger = logging.getLogger("jax")
    jax_level = jax_logger.level
    if jax_level == logging.NOTSET:
        jax_logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(shown)
        jax_logger.setLevel(jax_level)


def _spend_onednn_dtype_notice(tf) -> None:
    """With oneDNN on, TensorFlow logs `E0000 ... util.cc:131] oneDNN supports DT_INT64 only
    on platforms with AVX-512` once per process (one call_once for every data type), at the
    first int64 op its oneDNN kernels decline: a user's first `fit` or `saved_model_cli run`,
    on any CPU, AVX-512 or not. It is a notice (the op runs on Eigen, as always). Running one
    such op here, an int64 transpose in a private graph and session, spends it while stderr
    is captured; the eager runtime is left uninitialised, so thread and logical-device
    settings can still be made afterwards (about 70 ms)."""
    try:
        from tensorflow.python.util import _pywrap_util_port

        if not _pywrap_util_port.IsMklEnabled():
            return
        graph = tf.Graph()
        with graph.as_default():
            ids = tf.compat.v1.placeholder(tf.int64, [1, 1])
            transposed = tf.transpose(ids)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(transposed, {ids: [[0]]})
    except (ImportError, AttributeError, RuntimeError, tf.errors.OpError):
        pass  # another TensorFlow build: the notice, if any, is printed where it occurs


def import_tensorflow():
    """Imports TensorFlow (once), filtering its start-up notices from stderr; returns tf."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    os.environ.setdefault(LEVEL_ENV, DEFAULT_LEVEL)
    onednn = onednn_default()
    if onednn is not None:
        os.environ.setdefault(ONEDNN_ENV, onednn)
    level = log_level()
    if level <= 0:
        import tensorflow as tf

        return tf
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real file descriptor 2 (embedded interpreters)
        import tensorflow as tf

        return tf
    gpus_found = False
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            import tensorflow as tf

            gpus_found = bool(tf.config.list_physical_devices("GPU"))  # cuInit's message
            _spend_onednn_dtype_notice(tf)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode("utf-8", "replace")
            kept = "".join(line for line in text.splitlines(keepends=True)
                           if keep_line(line, level, gpus_found))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()
    return tf
