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
Everything else (Python warnings, real errors) comes back unchanged, in order. With
TF_CPP_MIN_LOG_LEVEL=0 nothing is filtered. The tools' packages call it before anything
imports TensorFlow; once TensorFlow is imported it does nothing.

It also turns on TensorFlow's oneDNN kernels on x86-64 CPUs where TensorFlow leaves them
off. TensorFlow 2.21 enables them by default only on CPUs with AVX-512 VNNI, BF16 or AMX;
on an AVX2-only CPU (an AMD EPYC Milan here) it runs Eigen's kernels. There the POS
fine-tuning benchmark trained at 18.7 examples/s against 21.7 with oneDNN: 1.11x
transformers' speed instead of 1.29x (torch uses oneDNN on every x86 CPU; BUILD_NOTES.md,
section 8.5). The environment decides when it says anything: TF_ENABLE_ONEDNN_OPTS=0 keeps
them off, and a process that imported TensorFlow first keeps TensorFlow's choice.
"""

from __future__ import annotations

import os
import platform
import re
import sys
import tempfile

LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
DEFAULT_LEVEL = "2"  # hide TensorFlow's C++ info and warnings; errors stay
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"

_BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# glog / absl C++ prefix: severity letter, MMDD, time (before absl is initialised
# "00:00:<seconds since 1970>"), thread id, file:line]
_GLOG = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ [^ \]]+:\d+\] ")
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


def onednn_default(machine: str | None = None) -> str | None:
    """The TF_ENABLE_ONEDNN_OPTS value to default to on this machine: "1" on x86-64 (the
    oneDNN kernels TensorFlow ships for it), None elsewhere (TensorFlow decides)."""
    machine = (machine or platform.machine()).lower()
    return "1" if machine in ("x86_64", "amd64") else None


def import_tensorflow():
    """Imports TensorFlow (once), filtering its start-up notices from stderr; returns tf."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    os.environ.setdefault(LEVEL_ENV, DEFAULT_LEVEL)
    onednn = onednn_default()
    if onednn is not None:
        os.environ.setdefault(ONEDNN_ENV, onednn)
    try:
        level = int(os.environ[LEVEL_ENV])
    except ValueError:
        level = int(DEFAULT_LEVEL)
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
