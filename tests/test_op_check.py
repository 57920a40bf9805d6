"""Tests for export.op_check: the servable-op check used by every export."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tensorflow as tf
import tensorflow_text as tf_text

from data_prep.tokenization import BertTokenizer
from export import op_check

SHARED_LIST = Path(__file__).resolve().parents[2] / "shared" / "serving" / "tf_text_2_12_ops.txt"


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("v") / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "##b", "."]) + "\n")
    return str(path)


def test_allowlist_is_the_spec_copy():
    names = op_check.load_allowlist()
    assert {"FastBertNormalize", "FastWordpieceTokenizeWithOffsets", "NormalizeUTF8"} <= names
    assert "TFText>RoundRobinTrim" not in names
    if SHARED_LIST.is_file():
        assert names == {l.strip() for l in SHARED_LIST.read_text().splitlines() if l.strip()}


def test_core_ops_exclude_tensorflow_text():
    core = op_check.core_ops()
    assert {"StringSplitV2", "RegexReplace", "RaggedTensorToTensor", "StatefulPartitionedCall"} <= core
    assert not {"FastBertNormalize", "TFText>RoundRobinTrim"} & core


def test_core_ops_newer_than_tensorflow_2_12_are_refused():
    """"Core" was whatever the TensorFlow installed here registers: FFTND and SegmentMaxV2,
    core ops since TensorFlow 2.15 and 2.16, passed the check and `export.verify`, and TF
    Serving's TensorFlow 2.12.1 refused the model ("Op type not registered 'FFTND'")."""
    fft = tf.function(lambda x: tf.math.abs(tf.signal.fftnd(x)),
                      input_signature=[tf.TensorSpec([None, None], tf.complex64)])
    segments = tf.function(
        lambda x, ids: tf.raw_ops.SegmentMaxV2(data=x, segment_ids=ids, num_segments=3),
        input_signature=[tf.TensorSpec([None], tf.float32), tf.TensorSpec([None], tf.int32)])
    version = op_check.registered_core_ops()[0]
    for fn, op in ((fft, "FFTND"), (segments, "SegmentMaxV2")):
        assert op in op_check.op_types(fn) and op in op_check.registered_core_ops()[1]
        with pytest.raises(op_check.OpCheckError,
                           match=rf"  {op}: a core op of TensorFlow {re.escape(version)} that "
                                 r"TensorFlow 2.12.1 lacks"):
            op_check.check_ops(fn)
    # The list is 2.12.1's own (made with --print_core_ops there; the integration tier
    # compares it where that interpreter is): most of today's core, not all of it.
    core = op_check.core_ops()
    assert len(core) > 1500 and core < op_check.registered_core_ops()[1] | core
    assert open(op_check.CORE_OPS_PATH).readline().startswith(
        "# Op types core TensorFlow 2.12.1 registers")


def test_print_core_ops_lists_this_tensorflows(capsys):
    """--print_core_ops prints the installed TensorFlow's core ops in the list's format (the
    command that made tf_2_12_core_ops.txt); without it a directory is required."""
    assert op_check.main(["--print_core_ops"]) == 0
    lines = capsys.readouterr().out.splitlines()
    version, names = op_check.registered_core_ops()
    assert lines[0] == (f"# Op types core TensorFlow {version} registers (`python -m "
                        f"export.op_check --print_core_ops` with tensorflow=={version}).")
    assert lines[1:] == sorted(names)
    with pytest.raises(SystemExit) as info:
        op_check.main([])
    assert info.value.code == 2
    assert "give at least one SAVED_MODEL_DIR (or --print_core_ops)" in capsys.readouterr().err


@pytest.mark.integration
def test_the_core_op_list_is_tensorflow_2_12s():
    import subprocess

    from conftest import REPO, tf212_python

    python = tf212_python()
    if python is None:
        pytest.skip("no tensorflow 2.12.1 interpreter (set BERT_KERAS_TF212_PYTHON)")
    printed = subprocess.run([python, "-m", "export.op_check", "--print_core_ops"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
    assert printed == op_check.CORE_OPS_PATH.read_text()


@pytest.mark.parametrize("chinese", [True, False])
def test_tokenizer_graph_passes(vocab, chinese):
    tok = BertTokenizer(vocab, tokenize_chinese_chars=chinese)
    fn = tf.function(tok.__call__, input_signature=[tf.TensorSpec([None], tf.string)])
    types = op_check.check_ops(fn)
    non_core = types - op_check.core_ops()
    assert non_core == {"FastBertNormalize", "FastWordpieceTokenizeWithOffsets"}
    if chinese:  # the >100-character branch is a nested function (tf.cond): listed too
        assert "UnsortedSegmentSum" in types
    detok = tf.function(tok.detokenize_tensor,
                        input_signature=[tf.RaggedTensorSpec([None, None], tf.int32)])
    assert op_check.check_ops(detok.get_concrete_function()) <= op_check.core_ops()


def test_saved_model_directory(tmp_path, vocab, capsys):
    tok = BertTokenizer(vocab)

    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.tok = tok

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, text):
            return {"ids": self.tok(text).to_tensor()}

    tf.saved_model.save(Module(), str(tmp_path / "3"), signatures=None)
    types = op_check.check_ops(str(tmp_path / "3"))
    assert {"FastBertNormalize", "FastWordpieceTokenizeWithOffsets"} <= types
    assert op_check.main([str(tmp_path / "3")]) == 0
    # The model's base directory stands for its highest version, as in TF Serving.
    assert op_check.main([str(tmp_path)]) == 0
    assert f"OK {tmp_path / '3'}: " in capsys.readouterr().out
    # As a program, as docs/serving.md runs it: the result alone, without TensorFlow's C++
    # start-up notices (absl's "All log messages before ...", oneDNN, cuda) every other
    # tool hides.
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, "-m", "export.op_check", str(tmp_path)], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_round_robin_trim_fails_with_clear_message(tmp_path):
    trimmer = tf_text.RoundRobinTrimmer(max_seq_length=6)

    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int32)] * 2)
    def pack(a, b):
        return trimmer.trim([a, b])

    with pytest.raises(op_check.OpCheckError) as err:
        op_check.check_ops(pack, what="keras-hub style packer")
    message = str(err.value)
    assert "keras-hub style packer" in message and "TFText>RoundRobinTrim" in message
    assert "tensorflow-text 2.12.1" in message and "tf_text_2_12_ops.txt" in message

    class Module(tf.Module):
        @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int32)] * 2)
        def serve(self, a, b):
            return {"ids": tf.concat(trimmer.trim([a, b]), axis=1).to_tensor()}

    tf.saved_model.save(Module(), str(tmp_path))
    with pytest.raises(op_check.OpCheckError, match=r"TFText>RoundRobinTrim"):
        op_check.check_ops(str(tmp_path))
    assert op_check.main([str(tmp_path)]) == 1


def test_unknown_custom_op_is_reported():
    graph_def = tf.compat.v1.GraphDef()
    graph_def.node.add(name="x", op="Placeholder")
    graph_def.node.add(name="y", op="MyCustomOp")
    with pytest.raises(op_check.OpCheckError, match="MyCustomOp: not a core TensorFlow op"):
        op_check.check_ops(graph_def)
    assert op_check.disallowed_ops({"MyCustomOp"}, allowlist={"MyCustomOp"}) == {}


def test_bad_arguments(tmp_path):
    with pytest.raises(op_check.OpCheckError, match="no saved_model.pb"):
        op_check.op_types(str(tmp_path))
    with pytest.raises(TypeError, match="input_signature"):
        op_check.op_types(tf.function(lambda x: x))
    with pytest.raises(TypeError, match="expects a SavedModel directory"):
        op_check.op_types(42)


def test_cli_help_and_unknown_flags():
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for module in ("export.op_check", "public_data.fetch"):
        env = dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="3")
        help_ = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                               text=True, env=env, timeout=300)
        assert help_.returncode == 0 and "usage: python -m " + module in help_.stdout
        arg = "sotu" if module == "public_data.fetch" else "x"
        bad = subprocess.run([sys.executable, "-m", module, "--no_such_flag", arg],
                             capture_output=True, text=True, env=env, timeout=300)
        assert bad.returncode == 2 and "unrecognized arguments: --no_such_flag" in bad.stderr
