"""data_prep.tf_logging: which of TensorFlow's start-up lines are shown at each level, and
the oneDNN default."""

import os
import subprocess
import sys

import pytest

from data_prep.tf_logging import (ONEDNN_ENV, is_log_line, keep_line, onednn_default,
                                  python_log_message)

# Lines TensorFlow 2.21 printed at import on a CPU-only machine with CUDA libraries.
BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
INFO = ("I0000 00:00:1795606032.180119    5851 port.cc:153] oneDNN custom operations are on. "
        "You may see slightly different numerical results\n")
CUDA = ("I0000 00:00:1795606032.180492    5851 cudart_stub.cc:31] Could not find cuda drivers "
        "on your machine, GPU will not be used.\n")
CUINIT = ("E0000 00:00:1795606054.221216    6243 cuda_platform.cc:52] failed call to cuInit: "
          "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n")
AVX = ("E0000 00:00:1795611050.563736   12091 util.cc:131] oneDNN supports DT_INT64 only on "
       "platforms with AVX-512. Falling back to the default Eigen-based implementation if present.\n")
WARN = "W1125 11:27:03.123456    5851 some_op.cc:12] a warning\n"
ERROR = "E1125 11:27:03.123456    5851 some_op.cc:12] a real error\n"
PYTHON = "/x/site-packages/foo.py:3: UserWarning: something\n"


def test_default_level_hides_notices_and_keeps_errors():
    for line in (BANNER, INFO, CUDA, WARN, CUINIT, AVX):
        assert not keep_line(line, 2, gpus_found=False), line
    for line in (ERROR, PYTHON):
        assert keep_line(line, 2, gpus_found=False), line
    # With a GPU found, a cuInit failure is news: kept.
    assert keep_line(CUINIT, 2, gpus_found=True)


def test_levels_follow_tf_cpp_min_log_level():
    assert [keep_line(l, 1, False) for l in (BANNER, INFO, WARN, ERROR)] == [False, False, True, True]
    assert all(keep_line(l, 0, False) for l in (BANNER, INFO, CUDA, CUINIT, WARN, ERROR, PYTHON))
    assert [keep_line(l, 3, False) for l in (ERROR, PYTHON)] == [False, True]


# absl's Python logging has the same prefix as TensorFlow's C++ log, with a .py file.
TOOL_INFO = "I1127 10:20:36.512345 140231 loop.py:88] step 50/375  loss 0.4121 (steps 1-50)\n"
TOOL_WARN = "W1127 10:20:36.512345 140231 loop.py:119] 3 training examples, fewer than 32\n"
TF_PYTHON = ("W1127 10:21:02.100000 140231 save.py:1130] Function `serve_pair` contains input "
             "name(s) wp_model with unsupported characters which will be renamed\n")


def test_a_programs_own_log_lines_are_picked_out_by_file_name():
    modules = {"loop.py", "runner.py"}
    assert python_log_message(TOOL_INFO, modules) == "step 50/375  loss 0.4121 (steps 1-50)\n"
    assert python_log_message(TOOL_WARN, modules) == ("warning: 3 training examples, fewer "
                                                      "than 32\n")
    for line in (TF_PYTHON, BANNER, INFO, CUDA, CUINIT, AVX, WARN, ERROR, PYTHON, "output\n"):
        assert python_log_message(line, modules) is None, line
    assert is_log_line(TOOL_INFO) and is_log_line(TF_PYTHON) and is_log_line(CUINIT)
    assert not is_log_line("  [CLS] the [MASK]>cat sat [SEP]\n") and not is_log_line(PYTHON)
    # TensorFlow's own Python log is filtered by level like its C++ log.
    assert not keep_line(TF_PYTHON, 2, False) and keep_line(TF_PYTHON, 1, False)


def test_onednn_default_is_x86_only():
    assert onednn_default("x86_64") == "1" and onednn_default("AMD64") == "1"
    assert onednn_default("aarch64") is None and onednn_default("arm64") is None


def _onednn_in_fresh_process(env_value):
    """Whether TensorFlow's oneDNN kernels are on after bert_keras's import, in a new process."""
    env = {k: v for k, v in os.environ.items() if k != ONEDNN_ENV}
    if env_value is not None:
        env[ONEDNN_ENV] = env_value
    code = ("import bert_keras\n"
            "from tensorflow.python.util import _pywrap_util_port as port\n"
            "print('ONEDNN', port.IsMklEnabled())\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout
    return out.split("ONEDNN ")[-1].strip() == "True"


@pytest.mark.integration  # Fresh TensorFlow processes: about 17 s on 2 cores.
def test_onednn_on_by_default_on_x86_and_the_environment_wins():
    if onednn_default() is None:
        pytest.skip("oneDNN is defaulted on x86-64 only")
    assert _onednn_in_fresh_process(None)
    assert not _onednn_in_fresh_process("0")


@pytest.mark.integration  # A fresh TensorFlow process: about 10 s on 2 cores.
def test_a_users_script_prints_nothing_and_can_still_configure_devices():
    """`import bert_keras` in a user's script: no start-up lines, no oneDNN int64 notice at
    the first int64 transpose (the op that triggers it), and the eager runtime is still
    unconfigured (logical CPU devices can be set, as --num_cpu_devices does)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CPP_MIN_LOG_LEVEL", ONEDNN_ENV)}
    code = ("import bert_keras\n"
            "import tensorflow as tf\n"
            "cpu = tf.config.list_physical_devices('CPU')[0]\n"
            "two = [tf.config.LogicalDeviceConfiguration()] * 2\n"
            "tf.config.set_logical_device_configuration(cpu, two)\n"
            "tf.config.threading.set_intra_op_parallelism_threads(1)\n"
            "print(tf.transpose(tf.constant([[1, 2]], tf.int64)).shape, "
            "len(tf.config.list_logical_devices('CPU')))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["(2,", "1)", "2"], proc.stdout
    assert proc.stderr == "", proc.stderr


def test_a_tools_run_hides_tensorflows_python_info_notes_only(monkeypatch):
    """Inside the tools' error boundary, INFO records logged from TensorFlow's own files
    (tf.distribute's `Reduce to ... then broadcast to ...`, 22 lines for a 2-replica
    run_pretraining) and JAX's loggers are dropped; TensorFlow's warnings, the tool's own INFO lines, and
    everything with TF_CPP_MIN_LOG_LEVEL=0 pass; the filter goes when the tool returns."""
    import importlib.util
    import logging

    from data_prep import cli

    tf_file = os.path.join(importlib.util.find_spec("tensorflow").submodule_search_locations[0],
                           "python", "distribute", "cross_device_ops.py")
    seen = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    def log_three():
        for name in ("tensorflow", "absl"):
            logger = logging.getLogger(name)
            for level, path, msg in ((logging.INFO, tf_file, f"{name}: reduce"),
                                     (logging.WARNING, tf_file, f"{name}: tf warning"),
                                     (logging.INFO, "/x/bert_keras/run_pretraining.py",
                                      f"{name}: ours")):
                logger.handle(logger.makeRecord(name, level, path, 1, msg, (), None))

    handler = Collect(level=logging.DEBUG)
    loggers = [logging.getLogger("tensorflow"), logging.getLogger("absl")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
        assert cli.report_errors(log_three) == 0
        assert seen == ["tensorflow: tf warning", "tensorflow: ours", "absl: tf warning",
                        "absl: ours"]
        # JAX's notes (xla_bridge's `Unable to initialize backend 'tpu'`) at INFO: hidden.
        jax_bridge = logging.getLogger("jax._src.xla_bridge")
        jax_bridge.addHandler(handler)
        try:
            seen.clear()
            cli.report_errors(lambda: (jax_bridge.info("no tpu"), jax_bridge.warning("jax warning")))
            assert seen == ["jax warning"]
            assert logging.getLogger("jax").level == logging.NOTSET  # restored
        finally:
            jax_bridge.removeHandler(handler)
        seen.clear()
        log_three()  # outside a tool's run: nothing is filtered
        assert len(seen) == 6
        seen.clear()
        monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
        assert cli.report_errors(log_three) == 0
        assert len(seen) == 6
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
