"""Encoder export: signatures, warmup, refusal to overwrite, clean-process verification."""

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from bert_keras import BertEncoder, BertPretrainer
from conftest import TINY, make_inputs
from export import saved_model_writer
from export.export_encoder import export_encoder
from export.saved_model_writer import ExportError, read_warmup_requests
from export.text_preprocessing import bert_pack_inputs
from export.verify import VerifyError, verify

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_vocab(path, size=99):
    vocab = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += [f"w{i}" for i in range(size - len(vocab))]
    path.write_text("\n".join(vocab) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    encoder = BertEncoder(**TINY)
    pretrainer = BertPretrainer(encoder)
    encoder.save_weights(str(tmp / "encoder.weights.h5"))
    encoder.to_bert_config().to_json_file(str(tmp / "bert_config.json"))
    vocab = write_vocab(tmp / "vocab.txt")
    path = export_encoder(encoder, str(tmp / "models"), vocab, pretrainer=pretrainer,
                          warmup_seq_length=16)
    return tmp, encoder, pretrainer, path


def test_layout_and_assets(exported):
    tmp, encoder, _, path = exported
    assert path == str(tmp / "models" / "1")
    for name in ("saved_model.pb", "assets/vocab.txt", "assets/bert_config.json",
                 "assets.extra/tf_serving_warmup_requests"):
        assert os.path.exists(os.path.join(path, name)), name
    # No temporary directory left behind.
    assert os.listdir(tmp / "models") == ["1"]


def test_signatures_match_keras(exported):
    _, encoder, pretrainer, path = exported
    loaded = tf.saved_model.load(path)
    assert {"serving_default", "encoder", "mlm"} <= set(loaded.signatures)
    x = make_inputs(batch=3, seq=12)
    out = loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in x.items()})
    ref = encoder(x)
    np.testing.assert_allclose(out["pooled_output"], ref["pooled_output"], atol=1e-5)
    np.testing.assert_allclose(out["default"], ref["pooled_output"], atol=1e-5)
    np.testing.assert_allclose(out["sequence_output"], ref["sequence_output"], atol=1e-5)
    stacked = np.stack([np.asarray(e) for e in ref["encoder_outputs"]], axis=1)
    np.testing.assert_allclose(out["encoder_outputs"], stacked, atol=1e-5)
    # The TF Hub-style call returns the list form, and `default` (TF Hub's text-embedding
    # key); the tokenizer of Google's tutorials reads vocab_file and do_lower_case.
    hub = loaded(x)
    assert len(hub["encoder_outputs"]) == TINY["num_layers"]
    np.testing.assert_allclose(hub["default"], ref["pooled_output"], atol=1e-5)
    assert loaded.vocab_file.asset_path.numpy().decode().endswith("vocab.txt")
    assert loaded.do_lower_case.numpy() is np.True_
    # The mlm endpoint.
    x["masked_lm_positions"] = np.array([[1, 2], [3, 4], [0, 0]], np.int32)
    mlm = loaded.signatures["mlm"](**{k: tf.constant(v) for k, v in x.items()})
    np.testing.assert_allclose(mlm["mlm_logits"], pretrainer(x)["mlm_logits"], atol=1e-4)


def test_warmup_records_parse_and_run(exported):
    _, _, _, path = exported
    requests = read_warmup_requests(os.path.join(path, saved_model_writer.WARMUP_FILE))
    assert [name for name, _ in requests] == ["serving_default", "serving_default", "mlm"]
    assert [r["input_word_ids"].shape for _, r in requests[:2]] == [(1, 16), (8, 16)]
    loaded = tf.saved_model.load(path)
    for name, inputs in requests:
        out = loaded.signatures[name](**{k: tf.constant(v) for k, v in inputs.items()})
        assert all(np.isfinite(v.numpy()).all() for v in out.values())


def test_encoder_takes_any_length_up_to_its_position_table(exported, tmp_path):
    """Issue 47: ids-in clients send their batch's own length; warmup covers the buckets."""
    _, encoder, _, _ = exported
    vocab = write_vocab(tmp_path / "vocab.txt")
    path = export_encoder(encoder, str(tmp_path / "m"), vocab, warmup_seq_length=16,
                          buckets=(4, 8, 99))
    requests = read_warmup_requests(os.path.join(path, saved_model_writer.WARMUP_FILE))
    assert [r["input_word_ids"].shape for _, r in requests] == [(1, 16), (8, 16), (1, 4), (1, 8)]
    serve = tf.saved_model.load(path).signatures["serving_default"]
    positions = TINY["max_sequence_length"]
    for seq in (1, 5, 17, positions):
        x = make_inputs(batch=2, seq=seq, lengths=[seq, max(1, seq // 2)])
        out = serve(**{k: tf.constant(v) for k, v in x.items()})
        np.testing.assert_allclose(out["sequence_output"], encoder(x)["sequence_output"],
                                   atol=1e-5)
    with pytest.raises(tf.errors.InvalidArgumentError):  # longer than the table: refused
        x = make_inputs(batch=1, seq=positions + 1)
        serve(**{k: tf.constant(v) for k, v in x.items()})


def test_refuses_to_overwrite_and_next_version(exported):
    tmp, encoder, _, path = exported
    vocab = str(tmp / "vocab.txt")
    with pytest.raises(ExportError, match="refusing to overwrite"):
        export_encoder(encoder, str(tmp / "models"), vocab, version=1)
    assert saved_model_writer.version_dir(str(tmp / "models"), None).endswith(os.sep + "2")
    with pytest.raises(ExportError, match="positive"):
        saved_model_writer.version_dir(str(tmp / "models"), 0)


@pytest.mark.parametrize("level", ["2", "0"])
def test_saving_hides_tensorflows_info_records_unless_asked(tmp_path, monkeypatch, level):
    """An export tool (absl's app.run: INFO) printed TensorFlow's notes for its developers
    while saving (`Function `serve` contains input name(s) ... will be renamed`, `Writing
    fingerprint`, `Assets written to`, a dozen lines); they are hidden unless
    TF_CPP_MIN_LOG_LEVEL=0 asks for every TensorFlow notice. The caller's own INFO and
    TensorFlow's warnings still pass."""
    import logging

    from absl import logging as absl_logging

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", level)
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Keep(level=logging.DEBUG)
    loggers = [tf.get_logger(), logging.getLogger("absl")]
    levels = [logger.level for logger in loggers]
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.INFO)
    for logger in loggers:
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
    try:
        module = tf.Module()
        module.scale = tf.Variable(3.0)
        serve = tf.function(lambda x: {"y": module.scale * x},
                            input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        saved_model_writer.write_saved_model(module, str(tmp_path / "1"),
                                             {"serving_default": serve.get_concrete_function()})
        absl_logging.info("the tool's own line")
        tf.get_logger().warning("a TensorFlow warning")
    finally:
        absl_logging.set_verbosity(verbosity)
        for logger, old in zip(loggers, levels):
            logger.removeHandler(handler)
            logger.setLevel(old)
    tensorflow_info = [r.getMessage() for r in records if r.levelno < logging.WARNING
                       and f"{os.sep}tensorflow{os.sep}" in r.pathname]
    if level == "0":
        assert any("fingerprint" in m for m in tensorflow_info), tensorflow_info
    else:
        assert tensorflow_info == []
    messages = [r.getMessage() for r in records]
    assert "the tool's own line" in messages and "a TensorFlow warning" in messages
    assert os.path.exists(tmp_path / "1" / "saved_model.pb")


def test_wrong_vocab_size_is_refused(exported, tmp_path):
    _, encoder, _, _ = exported
    from bert_keras.model_loading import VocabMismatchError

    vocab = write_vocab(tmp_path / "vocab.txt", size=50)
    with pytest.raises(VocabMismatchError, match=f"50 tokens for the {encoder.vocab_size} "
                       "embedding rows"):
        export_encoder(encoder, str(tmp_path / "m"), vocab)
    assert not os.path.exists(tmp_path / "m" / "1")


@pytest.mark.integration  # Verify's fresh processes: about 20 s on 2 cores.
def test_verify_passes_with_parity(exported):
    tmp, _, _, path = exported
    report = verify(path, init_checkpoint=str(tmp / "encoder.weights.h5"))
    assert report.ok, str(report)
    checks = [c for c, _, _ in report.lines]
    assert checks == ["ops", "load", "signatures", "warmup", "lengths", "session", "parity"]


def test_verify_fails_on_other_weights(exported, tmp_path):
    _, encoder, _, path = exported
    other = BertEncoder(**TINY)
    # Different weights (the per-test seed would otherwise reproduce the same ones).
    other.set_weights([w + 0.05 for w in encoder.get_weights()])
    other.save_weights(str(tmp_path / "encoder.weights.h5"))
    encoder.to_bert_config().to_json_file(str(tmp_path / "bert_config.json"))
    report = verify(path, init_checkpoint=str(tmp_path / "encoder.weights.h5"))
    assert not report.ok
    assert [c for c, ok, _ in report.lines if not ok] == ["parity"]


@pytest.mark.integration  # Two verify runs (fresh processes): about 30 s on 2 cores.
def test_parity_covers_every_layer_and_the_mlm_head(exported, tmp_path):
    """With a pretraining checkpoint, an export with the mlm signature is compared on its
    MLM logits too (and on every layer's output): the same encoder with other MLM-head
    weights fails on mlm_logits, where it passed before."""
    _, encoder, pretrainer, path = exported
    heads = [v.path for v in pretrainer.weights if v.path not in {w.path for w in
                                                                   encoder.weights}]
    assert heads  # the MLM transform and bias
    for name, shift in (("same", 0.0), ("other", 0.5)):
        other = BertPretrainer(BertEncoder(**TINY))
        other.set_weights([w + (shift if v.path in heads else 0.0)
                           for v, w in zip(pretrainer.weights, pretrainer.get_weights())])
        (tmp_path / name).mkdir()
        other.save_weights(str(tmp_path / name / "pretrainer.weights.h5"))
        encoder.to_bert_config().to_json_file(str(tmp_path / name / "bert_config.json"))
        report = verify(path, init_checkpoint=str(tmp_path / name / "pretrainer.weights.h5"))
        failed = [c for c, ok, _ in report.lines if not ok]
        parity = next(detail for c, _, detail in report.lines if c == "parity")
        if shift:
            assert failed == ["parity"] and "mlm_logits" in parity, str(report)
        else:
            assert not failed, str(report)


def perturb_one_weight(encoder, factor=1.01, name="intermediate"):
    """Encoder weights with one weight (the middle layer's feed-forward kernel) off by 1%:
    a wrong weight the verifier must catch (module docstring of export/verify.py)."""
    weights = encoder.get_weights()
    paths = [v.path for v in encoder.weights]
    middle = f"transformer_layer_{encoder.num_layers // 2}/"
    index = next(i for i, p in enumerate(paths) if middle in p and name in p)
    weights[index] = weights[index] * np.float32(factor)
    return weights


def test_tolerance_is_relative_to_each_outputs_scale():
    from export.verify import RTOL, within_tolerance

    assert RTOL == 1e-4
    assert within_tolerance(2.0e-5, 10.5)  # MiniLM's largest session difference
    assert not within_tolerance(2.0e-5, 0.1)  # the same error on a small output is not noise
    assert within_tolerance(0.0, 0.0) and not within_tolerance(1e-9, 0.0)


def test_verify_fails_on_one_perturbed_weight(exported, tmp_path):
    """Both directions of the tolerance on the tiny model: its export passes (above), and
    the same export compared with weights of which one is off by 10% fails. (1% moves this
    random model's outputs by only 7e-5 of their scale; MiniLM's by 3e-3, see the slow
    tests.)"""
    _, encoder, _, path = exported
    other = BertEncoder(**TINY)
    other.set_weights(perturb_one_weight(encoder, factor=1.1))
    other.save_weights(str(tmp_path / "encoder.weights.h5"))
    encoder.to_bert_config().to_json_file(str(tmp_path / "bert_config.json"))
    report = verify(path, init_checkpoint=str(tmp_path / "encoder.weights.h5"))
    assert [c for c, ok, _ in report.lines if not ok] == ["parity"], str(report)


@pytest.mark.slow
def test_verify_a_base_size_model_with_trained_like_weights(tmp_path):
    """BERT-base's shape with weights of a trained model's statistics: nonzero biases,
    LayerNorm gammas in [0.3, 3] and betas, kernels at twice the initializer's spread.
    (Freshly initialized models agree bit for bit across runtimes: their biases are 0.)
    Here the session loader differs by up to 5.9e-6 of the output scale; the export passes,
    and the same export compared with one weight off by 1% fails."""
    from bert_keras import BertConfig

    rng = np.random.default_rng(1)
    encoder = BertEncoder.from_bert_config(BertConfig.from_preset("base"))
    weights = []
    for variable, value in zip(encoder.weights, encoder.get_weights()):
        if variable.path.endswith("gamma"):
            value = rng.uniform(0.3, 3.0, value.shape)
        elif variable.path.endswith(("beta", "bias")):
            value = rng.normal(0.0, 0.2, value.shape)
        else:
            value = value * 2
        weights.append(value.astype("float32"))
    encoder.set_weights(weights)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                               + [f"w{i}" for i in range(30522 - 5)]) + "\n")
    encoder.save_weights(str(tmp_path / "encoder.weights.h5"))
    encoder.to_bert_config().to_json_file(str(tmp_path / "bert_config.json"))
    path = export_encoder(encoder, str(tmp_path / "models"), str(vocab))
    report = verify(path, init_checkpoint=str(tmp_path / "encoder.weights.h5"))
    print(report)
    assert report.ok, str(report)

    wrong = tmp_path / "wrong"
    wrong.mkdir()
    encoder.set_weights(perturb_one_weight(encoder))
    encoder.save_weights(str(wrong / "encoder.weights.h5"))
    encoder.to_bert_config().to_json_file(str(wrong / "bert_config.json"))
    report = verify(path, init_checkpoint=str(wrong / "encoder.weights.h5"))
    print(report)
    assert [c for c, ok, _ in report.lines if not ok] == ["parity"], str(report)


def _saved_model_cli(args, text=False):
    """Runs TensorFlow's saved_model_cli in a fresh interpreter (TF Serving's loader path).

    With `text`, tensorflow_text is imported first to register its ops, as TF Serving links
    them in (DESIGN §9: saved_model_cli itself does not).
    """
    code = ("import sys\n" + ("import tensorflow_text\n" if text else "")
            + "from tensorflow.python.tools import saved_model_cli\n"
            + "sys.argv = ['saved_model_cli'] + sys.argv[1:]\nsaved_model_cli.main()\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-c", code] + args, capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.integration  # saved_model_cli in fresh processes: about 15 s on 2 cores.
def test_saved_model_cli_show_and_run(exported, tmp_path):
    """`saved_model_cli show --all` and `run` succeed on the encoder export (issue 8)."""
    _, encoder, _, path = exported
    show = _saved_model_cli(["show", "--dir", path, "--all"])
    assert show.returncode == 0, show.stderr[-2000:]
    assert "signature_def['serving_default']" in show.stdout
    assert "input_word_ids" in show.stdout and "pooled_output" in show.stdout
    x = make_inputs(batch=2, seq=10)
    np.savez(tmp_path / "in.npz", **x)
    outdir = tmp_path / "out"
    inputs = ";".join(f"{k}={tmp_path / 'in.npz'}[{k}]" for k in x)
    run = _saved_model_cli(["run", "--dir", path, "--tag_set", "serve", "--signature_def",
                            "serving_default", "--inputs", inputs, "--outdir", str(outdir)])
    assert run.returncode == 0, run.stderr[-2000:]
    # saved_model_cli writes each output as <outdir>/<output key>.npy.
    pooled = np.load(outdir / "pooled_output.npy")
    np.testing.assert_allclose(pooled, encoder(x)["pooled_output"], atol=1e-5)


@pytest.mark.integration  # An export and verify's fresh processes: about 15 s on 2 cores.
def test_verify_fails_when_the_session_loader_cannot_restore(tmp_path):
    """An export that tracks the Keras model object itself loads in TF2 but not in TF
    Serving: Keras 3 variables save as copies the TF1 loader restores instead of the
    variables the functions read. verify must catch it (the bug this check was added for)."""
    encoder = BertEncoder(**TINY)
    x = make_inputs(batch=2, seq=8)

    class Naive(tf.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        @tf.function(input_signature=[{k: tf.TensorSpec([None, None], tf.int32, name=k)
                                       for k in x}])
        def serve(self, inputs):
            return {"pooled_output": self.encoder(inputs, training=False)["pooled_output"]}

    module = Naive()
    path = saved_model_writer.write_saved_model(
        module, str(tmp_path / "1"), {"serving_default": module.serve.get_concrete_function()},
        warmup=[("serving_default", x)])
    # write_saved_model tracks the captured variables, so this one restores; the same
    # module saved naively does not.
    naive = str(tmp_path / "naive")
    naive_module = Naive()
    tf.saved_model.save(naive_module, naive,
                        signatures={"serving_default": naive_module.serve.get_concrete_function()})
    os.makedirs(os.path.join(naive, "assets.extra"))
    os.rename(os.path.join(path, saved_model_writer.WARMUP_FILE),
              os.path.join(naive, saved_model_writer.WARMUP_FILE))
    report = verify(naive)
    assert [c for c, ok, _ in report.lines if not ok] == ["session"], str(report)
    assert "Could not find variable" in str(report)


def test_a_base_directory_stands_for_the_version_tf_serving_serves(tmp_path):
    """TF Serving serves a base directory's highest numbered version, complete or not;
    verify and op_check check that one (the export tools' --export_dir is the base)."""

    base = tmp_path / "spam"
    for name in ("1", "2", "10", ".incomplete-7.1", "3x"):
        os.makedirs(base / name)
    (base / "11").write_text("a file, not a version")
    for name in ("1", "2"):
        (base / name / "saved_model.pb").write_bytes(b"")
    assert saved_model_writer.served_version(str(base)) == str(base / "10")
    assert saved_model_writer.served_version(str(base / "2")) == str(base / "2")
    assert saved_model_writer.served_version(str(tmp_path)) == str(tmp_path)  # no version
    assert saved_model_writer.served_version(str(tmp_path / "x")) == str(tmp_path / "x")
    # Version 10 is what TF Serving would load, and it is incomplete: named, not skipped.
    with pytest.raises(VerifyError, match=f"--export_dir {base / '10'}: no saved_model.pb"):
        verify(str(base))
    with pytest.raises(VerifyError, match=f"--export_dir {tmp_path}: no saved_model.pb in it "
                       "or in a numbered version directory"):
        verify(str(tmp_path))
    with pytest.raises(VerifyError, match="no such directory"):
        verify(str(tmp_path / "x"))


def test_the_session_check_names_an_output_with_values_when_every_difference_is_zero(tmp_path):
    """With no difference anywhere the report names the largest output, not the first
    request's (often an empty text's: "max |x| 0")."""
    from export.serving_probe import session_replay

    class Double(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def serve(self, x):
            return {"y": 2.0 * x}

    module = Double()
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": module.serve})
    requests = [("serving_default", {"x": np.zeros([0], np.float32)}),
                ("serving_default", {"x": np.array([0.5, -3.0], np.float32)})]
    expected = [{"y": 2.0 * r["x"]} for _, r in requests]
    result = session_replay(str(tmp_path), requests, expected)
    assert result["error"] is None and result["requests"] == 2
    assert result["worst"] == {"output": "serving_default/y", "diff": 0.0, "scale": 6.0}


def test_the_session_checks_scale_leaves_out_the_padding_fill(tmp_path):
    """Span-QA and tagger logits are -10000 at padding positions: with the fill in the
    scale, the session check's tolerance on logits of about 1 was 1.0, so a session path
    that moved them by 0.5 passed."""
    from export import length_buckets
    from export.serving_probe import PADDING_FILL, session_replay
    from export.verify import within_tolerance

    assert PADDING_FILL == length_buckets.PADDING_LOGIT

    class Logits(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def serve(self, x):
            return {"logits": tf.where(x > 0, x, length_buckets.PADDING_LOGIT)}

    module = Logits()
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": module.serve})
    x = np.array([0.5, 1.25, -1.0, -1.0], np.float32)
    served = np.where(x > 0, x, length_buckets.PADDING_LOGIT)
    # What the other path (TF2) answered: the same, and one logit off by 0.5.
    for moved, scale in [(0.0, 1.25), (0.5, 1.75)]:
        result = session_replay(str(tmp_path), [("serving_default", {"x": x})],
                                [{"logits": served + np.array([0, moved, 0, 0], np.float32)}])
        worst = result["worst"]
        assert (worst["diff"], worst["scale"]) == (moved, scale)
        assert within_tolerance(worst["diff"], worst["scale"]) == (moved == 0.0)


@pytest.mark.integration  # Verify's command line, fresh processes: about 35 s on 2 cores.
def test_verify_cli_exit_status(exported, tmp_path):
    _, _, _, path = exported
    env = dict(os.environ, PYTHONPATH=ROOT)
    # The model's base directory, as the export tools' --export_dir names it: its version.
    ok = subprocess.run([sys.executable, "-m", "export.verify",
                         f"--export_dir={os.path.dirname(path)}"],
                        capture_output=True, text=True, env=env, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"verify {path}\n" in ok.stdout and "result: PASS" in ok.stdout
    missing = subprocess.run([sys.executable, "-m", "export.verify", f"--export_dir={tmp_path}"],
                             capture_output=True, text=True, env=env, timeout=300)
    assert missing.returncode == 1 and "no saved_model.pb" in missing.stderr
    assert missing.stderr.strip().splitlines()[-1].startswith("error: --export_dir")


def test_in_graph_packing_equals_google_truncation():
    from data_prep.packing import pack

    seq_length = 9
    pairs = list(itertools.product(range(9), range(9)))
    a = tf.ragged.constant([list(range(10, 10 + la)) for la, _ in pairs], tf.int32, ragged_rank=1)
    b = tf.ragged.constant([list(range(50, 50 + lb)) for _, lb in pairs], tf.int32, ragged_rank=1)
    out = bert_pack_inputs([a, b], seq_length, cls_id=1, sep_id=2)
    for i, (la, lb) in enumerate(pairs):
        p = pack(list(range(10, 10 + la)), list(range(50, 50 + lb)), seq_length, 1, 2)
        pad = seq_length - len(p.tokens)
        assert list(out["input_word_ids"][i].numpy()) == p.tokens + [0] * pad, (la, lb)
        assert list(out["input_type_ids"][i].numpy()) == p.segment_ids + [0] * pad, (la, lb)
        assert list(out["input_mask"][i].numpy()) == [1] * len(p.tokens) + [0] * pad
    single = bert_pack_inputs([a[:12]], 5, cls_id=1, sep_id=2)
    for i in range(12):
        la = pairs[i][0]
        kept = min(la, 3)
        assert list(single["input_word_ids"][i].numpy()[: kept + 2]) == [1, *range(10, 10 + kept), 2]


def test_parity_with_a_checkpoint_is_refused_for_a_text_in_export(tmp_path):
    """Parity feeds an encoder's token ids: a text-in export is refused in one line before
    anything runs, not reported as failing to load (the ids do not fit its `text` input)."""
    class TextIn(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, text):
            return {"length": tf.strings.length(text)}

    module = TextIn()
    path = saved_model_writer.write_saved_model(
        module, str(tmp_path / "m" / "1"),
        {"serving_default": module.serve.get_concrete_function()})
    with pytest.raises(VerifyError, match=r"--init_checkpoint: .* encoder export .* text-in "
                       r"export \(signatures \[.*'serving_default'"):
        verify(path, init_checkpoint=str(tmp_path / "run"))


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # Verify's fresh processes: about 1 min on 2 cores.
def test_verify_preprocessor_and_reject_round_robin(tmp_path):
    """Our preprocessor passes; one packed with tensorflow_text's RoundRobinTrimmer fails."""
    import tensorflow_text as tf_text

    from data_prep.tokenization import BertTokenizer
    from export.export_preprocessor import export_preprocessor

    vocab = write_vocab(tmp_path / "vocab.txt")
    path = export_preprocessor(BertTokenizer(vocab), str(tmp_path / "pre"), seq_length=8)
    report = verify(path)
    assert report.ok, str(report)
    assert "FastWordpieceTokenizeWithOffsets" in report.lines[0][2]

    class Trimmed(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, text):
            pieces = tf.strings.split(text)
            ids = tf.strings.to_hash_bucket_fast(pieces, 50)
            (trimmed,) = tf_text.RoundRobinTrimmer(max_seq_length=4).trim([ids])
            return {"ids": trimmed.to_tensor()}

    module = Trimmed()
    bad = saved_model_writer.write_saved_model(
        module, str(tmp_path / "bad" / "1"), {"serving_default": module.serve.get_concrete_function()},
        warmup=[("serving_default", {"text": np.array([b"a b c d e f"], dtype=object)})])
    report = verify(bad)
    assert not report.ok
    failed = {c: detail for c, ok, detail in report.lines if not ok}
    assert "TFText>RoundRobinTrim" in failed["ops"]


_HUB_PROBE = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (what TF Hub users import before hub.load)
pre = tf.saved_model.load(sys.argv[1])
texts = tf.constant(json.loads(sys.argv[2]))
tok = pre.tokenize(texts)
out = {"root": pre(texts)["input_word_ids"].numpy().tolist(),
       "ragged_rank": tok.ragged_rank,
       "words": tok.to_list(),
       "special": {k: int(v) for k, v in pre.tokenize.get_special_tokens_dict().items()},
       "pair": pre.bert_pack_inputs([tok, tok], seq_length=9)["input_word_ids"].numpy().tolist(),
       "flat": pre.bert_pack_inputs([tok.merge_dims(1, 2)],
                                    seq_length=tf.constant(7))["input_word_ids"].numpy().tolist()}
spec = tf.RaggedTensorSpec([None, None, None], tf.int32)
try:  # two segments of other batch sizes, in a graph (a hub.KerasLayer's, a server's)
    tf.function(lambda a, b: pre.bert_pack_inputs([a, b]), input_signature=[spec, spec])(
        tok, tok[:1])
except tf.errors.InvalidArgumentError as e:
    out["mismatch"] = e.message.splitlines()[0]
assert not [m for m in sys.modules if m.split(".")[0] in ("bert_keras", "data_prep", "export")]
json.dump(out, sys.stdout)
"""


@pytest.mark.integration  # About 75 s on 2 cores.
def test_preprocessor_follows_the_tf_hub_api_in_a_fresh_process(tmp_path):
    """obj(texts), obj.tokenize (words x pieces), get_special_tokens_dict and
    bert_pack_inputs(segments, seq_length=...) behave like TF Hub's BERT preprocessors."""
    from data_prep.packing import pack
    from data_prep.tokenization import BertTokenizer
    from export.export_preprocessor import export_preprocessor

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in [
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "the", "cat",
        ",", "sat"]), encoding="utf-8")
    tokenizer = BertTokenizer(str(vocab))
    path = export_preprocessor(tokenizer, str(tmp_path / "pre"), seq_length=8)
    texts = ["unaffable cat, the cat sat", "", "zzz the"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    probe = tmp_path / "probe.py"
    probe.write_text(_HUB_PROBE)
    proc = subprocess.run([sys.executable, str(probe), path, json.dumps(texts)], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    ids = tokenizer.encode(texts)
    # tokenize: one inner list per word, "##" pieces with the piece before them.
    assert got["ragged_rank"] == 2
    assert got["words"][0] == [[5, 6, 7], [9], [10], [8], [9], [11]] and got["words"][1] == []
    assert [sum(row, []) for row in got["words"]] == ids
    assert got["special"] == {"vocab_size": 12, "start_of_sequence_id": 2,
                              "end_of_segment_id": 3, "padding_id": 0, "mask_id": 4}

    def packed(a, b, length):
        p = pack(a, b, length, tokenizer.cls_id, tokenizer.sep_id)
        return p.tokens + [0] * (length - len(p.tokens))

    assert got["root"] == [packed(t, None, 8) for t in ids]
    assert got["pair"] == [packed(t, t, 9) for t in ids]
    assert got["flat"] == [packed(t, None, 7) for t in ids]
    # Before, "Dimensions must be equal" from a node deep inside (still TensorFlow's shape
    # inference's message where both batch sizes are static, as in an eager call).
    assert ("assertion failed: [bert_pack_inputs: every segment must hold as many rows "
            "(texts) as the first]") in got["mismatch"], got["mismatch"]
    assert verify(path).ok


@pytest.fixture(scope="module")
def classifier_export(tmp_path_factory):
    from bert_keras.tasks import BertClassifier
    from data_prep.tokenization import BertTokenizer
    from export.export_classifier import export_classifier

    tmp = tmp_path_factory.mktemp("classifier")
    vocab = write_vocab(tmp / "vocab.txt")
    tokenizer = BertTokenizer(vocab)
    classifier = BertClassifier(BertEncoder(**TINY), num_classes=3)
    path = export_classifier(classifier, tokenizer, ["neg", "neu", "pos"], str(tmp / "m"),
                             seq_length=16)
    import tensorflow_text  # noqa: F401  (the export holds text ops)

    return classifier, tokenizer, tf.saved_model.load(path), path


def _keras_probabilities(classifier, tokenizer, texts_a, texts_b=None, seq_length=16):
    """The reference path: Python tokenizer + data_prep.packing + the Keras model."""
    from data_prep.packing import pack, pad_features

    ids_a = tokenizer.encode(texts_a)
    ids_b = tokenizer.encode(texts_b) if texts_b is not None else [None] * len(ids_a)
    packed = [pack(a, b, seq_length, tokenizer.cls_id, tokenizer.sep_id) for a, b in zip(ids_a, ids_b)]
    f = pad_features([p.tokens for p in packed], [p.segment_ids for p in packed], seq_length)
    x = {"input_word_ids": f["input_ids"], "input_mask": f["input_mask"],
         "input_type_ids": f["segment_ids"]}
    logits = np.asarray(classifier(x, training=False)["logits"])
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


SERVING_TEXTS = ["", "w1 w2 w3", " ".join(f"w{i % 90}" for i in range(10_000)),
                 "w5 東京 서울 naïve 🙂 w7", "W12, w13! [MASK] w14"]


@pytest.mark.integration  # The text-in export (module fixture, about 50 s) and its requests.
def test_classifier_export_equals_keras(classifier_export):
    classifier, tokenizer, loaded, _ = classifier_export
    out = loaded.signatures["serving_default"](text=tf.constant(SERVING_TEXTS))
    expected = _keras_probabilities(classifier, tokenizer, SERVING_TEXTS)
    np.testing.assert_allclose(out["probabilities"], expected, atol=1e-5)
    assert [l.decode() for l in out["label"].numpy()] == [
        ["neg", "neu", "pos"][i] for i in expected.argmax(-1)]
    pair = loaded.signatures["pair"](text_a=tf.constant(SERVING_TEXTS),
                                     text_b=tf.constant(SERVING_TEXTS[::-1]))
    expected = _keras_probabilities(classifier, tokenizer, SERVING_TEXTS, SERVING_TEXTS[::-1])
    np.testing.assert_allclose(pair["probabilities"], expected, atol=1e-5)


@pytest.mark.integration  # Shares the text-in export of the test above.
def test_classifier_export_saves_only_what_it_serves(classifier_export):
    """What a text-in export's graph must not hold (BUILD_NOTES 2, "A text-in export's graph
    holds what its signatures run"): the preprocessor export's functions, the layers'
    custom gradients, and ragged concats (whose asserts ran on every request)."""
    from tensorflow.core.protobuf import saved_model_pb2

    *_, path = classifier_export
    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    meta_graph = saved_model.meta_graphs[0]
    names = [f.signature.name for f in meta_graph.graph_def.library.function]
    assert not [n for n in names if "grad_fn" in n or "RaggedConcat" in n], names
    objects = meta_graph.object_graph_def.nodes
    functions = {c.local_name for node in objects for c in node.children
                 if objects[c.node_id].WhichOneof("kind") == "function"}
    assert functions == {"serve", "serve_pair", "serve_examples"}, functions
    assert set(meta_graph.signature_def) - {"__saved_model_init_op"} == {
        "serving_default", "pair", "serve_examples"}


@pytest.mark.integration  # Shares the text-in export of the test above.
@pytest.mark.parametrize("batch", [1, 64])
def test_classifier_batch_sizes_and_examples(classifier_export, batch):
    from export.export_classifier import _example

    _, _, loaded, _ = classifier_export
    texts = [SERVING_TEXTS[i % len(SERVING_TEXTS)] for i in range(batch)]
    out = loaded.signatures["serving_default"](text=tf.constant(texts))
    assert out["probabilities"].shape == (batch, 3) and out["label"].shape == (batch,)
    np.testing.assert_allclose(out["probabilities"].numpy().sum(-1), 1.0, atol=1e-5)
    examples = tf.constant([_example(t) for t in texts])
    classified = loaded.signatures["serve_examples"](inputs=examples)
    assert classified["classes"].shape == (batch, 3)
    np.testing.assert_allclose(classified["scores"], out["probabilities"], atol=1e-6)


@pytest.mark.integration  # Shares the text-in export's fixture.
def test_preprocessor_long_and_empty_inputs(classifier_export):
    from export.export_preprocessor import PreprocessorModule

    _, tokenizer, _, _ = classifier_export
    module = PreprocessorModule(tokenizer, seq_length=16)
    out = module.serve(tf.constant(SERVING_TEXTS))
    ids = out["input_word_ids"].numpy()
    assert ids.shape == (5, 16)
    assert list(ids[0][:2]) == [tokenizer.cls_id, tokenizer.sep_id]  # empty text
    assert out["input_mask"].numpy()[2].sum() == 16  # 10,000 words truncated to 16
    assert ids[2][-1] == tokenizer.sep_id
    pair = module.serve_pair(tf.constant([SERVING_TEXTS[2]]), tf.constant(["w1 w2"]))
    # Fair truncation: the short segment keeps all its tokens, the long one the rest.
    assert list(pair["input_type_ids"].numpy()[0]).count(1) == 3  # "w1 w2 [SEP]"


@pytest.mark.integration  # Verify's fresh processes on the text-in export: about 35 s on 2 cores.
def test_classifier_verifies(classifier_export):
    _, _, _, path = classifier_export
    report = verify(path)
    assert report.ok, str(report)
    assert "serve_examples for Classify" in report.lines[2][2]
    assert [c for c, _, _ in report.lines] == ["ops", "load", "signatures", "warmup", "lengths",
                                               "session"]
    # --max_seq_length=16 under the default buckets: one bucket, 16; TINY's table is 40.
    assert report.lines[4][2] == (
        "serving length 16 <= 40 positions (rows of embeddings/position_embeddings); the "
        "warmup runs every length bucket (16) on serving_default, pair, serve_examples")


@pytest.mark.integration  # saved_model_cli run in a fresh process: about 15 s on 2 cores.
def test_classifier_saved_model_cli_run(classifier_export, tmp_path):
    """Text in through saved_model_cli run (the session loader), with tensorflow_text."""
    classifier, tokenizer, _, path = classifier_export
    texts = ["w1 w2 w3", "w4"]
    run = _saved_model_cli(["run", "--dir", path, "--tag_set", "serve", "--signature_def",
                            "serving_default", "--input_exprs", f"text={texts!r}",
                            "--outdir", str(tmp_path)], text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    np.testing.assert_allclose(np.load(tmp_path / "probabilities.npy"),
                               _keras_probabilities(classifier, tokenizer, texts), atol=1e-5)


@pytest.mark.parametrize("module", ["export.export_encoder", "export.export_preprocessor",
                                    "export.export_classifier", "export.verify"])
# Two tool processes per case: about 15 s each on 2 cores. Not in CI (time):
# test_readme_commands' --help and flag tests cover these tools there; make test-all runs it.
@pytest.mark.integration
@pytest.mark.slow
def test_cli_help_and_unknown_flags(module):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    help_ = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                           text=True, env=env, timeout=300)
    assert help_.returncode == 0 and "--export_dir" in help_.stdout and help_.stderr == ""
    bad = subprocess.run([sys.executable, "-m", module, "--export_dir=x", "--no_such_flag=1"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode != 0 and "no_such_flag" in bad.stderr


def _one_line_refusal(module, model_flag, tmp_path, capsys, *flag_args) -> str:
    """The export tool `module` run in this process on a missing model path: its one-line
    error (the export directory is checked before the model is loaded)."""
    import importlib

    from absl import flags

    tool = importlib.import_module(f"export.{module}")
    flags.FLAGS(["prog", f"--{model_flag}={tmp_path / 'missing'}", *flag_args])
    try:
        status = tool.main(["prog"])
    finally:
        flags.FLAGS.unparse_flags()
    err = capsys.readouterr().err
    assert status == 1 and len(err.strip().splitlines()) == 1, err
    assert "missing" not in err
    return err


@pytest.mark.parametrize("module,model_flag", [("export_classifier", "model_dir"),
                                               ("export_encoder", "init_checkpoint")])
def test_existing_version_is_one_line_before_loading(module, model_flag, tmp_path, capsys):
    """The model path does not exist: the version is checked first, in one line."""
    (tmp_path / "models" / "3").mkdir(parents=True)
    err = _one_line_refusal(module, model_flag, tmp_path, capsys,
                            f"--export_dir={tmp_path / 'models'}", "--version=3")
    assert "refusing to overwrite an export" in err


@pytest.mark.parametrize("module,model_flag", [("export_classifier", "model_dir"),
                                               ("export_span_qa", "model_dir")])
def test_a_version_directory_as_export_dir_is_refused(module, model_flag, tmp_path, capsys):
    """--export_dir=models/1, a served version: the export went into models/1/1, exited 0,
    and TF Serving at models/ went on serving the old version 1 (verify of models/1 too)."""
    served = tmp_path / "models" / "1"
    served.mkdir(parents=True)
    (served / "saved_model.pb").write_bytes(b"")
    before = sorted(os.listdir(served))
    err = _one_line_refusal(module, model_flag, tmp_path, capsys, f"--export_dir={served}")
    assert (f"--export_dir {served} holds a SavedModel (saved_model.pb): it is a version "
            f"directory; give the model's base directory ({tmp_path / 'models'})") in err
    assert sorted(os.listdir(served)) == before


@pytest.mark.integration  # The export tool in fresh processes: about 30 s on 2 cores.
def test_export_encoder_cli_end_to_end(exported, tmp_path):
    tmp, encoder, _, _ = exported
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    cmd = [sys.executable, "-m", "export.export_encoder", f"--init_checkpoint={tmp}",
           f"--export_dir={tmp_path / 'enc'}", "--seq_length=8"]
    # Our weights directory without vocab.txt beside it: a clear error, no traceback.
    bare = tmp_path / "bare"
    bare.mkdir()
    encoder.save_weights(str(bare / "encoder.weights.h5"))
    encoder.to_bert_config().to_json_file(str(bare / "bert_config.json"))
    fail = subprocess.run(cmd[:3] + [f"--init_checkpoint={bare}"] + cmd[4:], capture_output=True,
                          text=True, env=env, timeout=300)
    assert fail.returncode != 0 and "vocab.txt" in fail.stderr and "Traceback" not in fail.stderr
    ok = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip().endswith(os.path.join("enc", "1"))
    again = subprocess.run(cmd + ["--version=1"], capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode != 0 and "refusing to overwrite" in again.stderr


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # two exports: ~45 s on 2 cores (the default suite's time)
def test_a_model_with_one_segment_embedding_gets_no_pair_signature(tmp_path):
    """A second text is segment 1, which a one-row segment table reads as a zero row,
    silently: `--pair` and span QA are refused for such a model, and its classifier export
    has no "pair" signature; single texts are served."""
    import tensorflow_text  # noqa: F401  (the export holds text ops)

    from bert_keras.tasks import BertClassifier, BertSpanQA
    from data_prep.tokenization import BertTokenizer
    from export.export_classifier import export_classifier
    from export.export_span_qa import export_span_qa

    tokenizer = BertTokenizer(write_vocab(tmp_path / "vocab.txt"))
    classifier = BertClassifier(BertEncoder(**TINY, type_vocab_size=1), num_classes=2)
    with pytest.raises(ExportError, match=r"^--pair, but the model has type_vocab_size=1 .* second text as zeros"):
        export_classifier(classifier, tokenizer, ["a", "b"], str(tmp_path / "pair"),
                          seq_length=16, pair=True, buckets=())
    assert not (tmp_path / "pair").exists()
    with pytest.raises(ExportError, match=r"^span QA reads the context as a second text, but the model has type_vocab_size=1"):
        export_span_qa(BertSpanQA(BertEncoder(**TINY, type_vocab_size=1)), tokenizer,
                       str(tmp_path / "qa"), seq_length=16, buckets=())
    assert not (tmp_path / "qa").exists()
    path = export_classifier(classifier, tokenizer, ["a", "b"], str(tmp_path / "single"),
                             seq_length=16, buckets=())
    loaded = tf.saved_model.load(path)
    assert sorted(loaded.signatures) == ["serve_examples", "serving_default"]
    assert not hasattr(loaded, "serve_pair")  # nor a function that reads pairs
    np.testing.assert_allclose(
        loaded.signatures["serving_default"](text=tf.constant(["w1 w2"]))["probabilities"],
        _keras_probabilities(classifier, tokenizer, ["w1 w2"]), atol=1e-5)


_WINDOWS_VOCAB_PROBE = r"""
import json, sys
import tensorflow as tf
import tensorflow_text as tf_text
pre = tf.saved_model.load(sys.argv[1])
texts = json.loads(sys.argv[2])
ids = pre.signatures["serving_default"](text=tf.constant(texts))["input_word_ids"].numpy()
# The asset as TF Hub's tutorials use a vocab_file: a lookup table built from the file.
asset = tf_text.BertTokenizer(sys.argv[3], lower_case=True).tokenize(tf.constant(texts))
json.dump({"version": tf.__version__, "ids": ids.tolist(),
           "asset": asset.merge_dims(1, 2).to_list()}, sys.stdout)
"""


@pytest.mark.slow  # CI's time (BUILD_NOTES 8.5): make test-all runs it
@pytest.mark.integration  # An export and two fresh processes (TF 2.21 and 2.12.1): ~40 s.
def test_a_vocabulary_saved_on_windows_exports_the_same_ids(tmp_path):
    """A vocab.txt with "\\r\\n" line ends, exported: the preprocessor gives the ids of the
    same vocabulary with "\\n" (the Python tokenizer's, packed), in this TensorFlow and in
    TF 2.12.1 + tensorflow-text 2.12.1 (stock TF Serving's), and the vocab_file asset read
    as TF Hub's tutorials read it (tensorflow_text.BertTokenizer on the file, whose text
    lookup table drops the "\\r") gives the same WordPieces. Before, such a file was refused."""
    from conftest import tf212_python
    from data_prep.packing import pack
    from data_prep.tokenization import BertTokenizer
    from export.export_preprocessor import export_preprocessor

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "the",
              "cat", "sat", "on", "mat", "##s", ".", ","]
    (tmp_path / "lf").mkdir()
    (tmp_path / "crlf").mkdir()
    (tmp_path / "lf" / "vocab.txt").write_bytes("".join(t + "\n" for t in tokens).encode())
    (tmp_path / "crlf" / "vocab.txt").write_bytes("".join(t + "\r\n" for t in tokens).encode())
    texts = ["The cat sat on the mats.", "unaffable cats, un dog", "mat"]
    seq = 11
    lf = BertTokenizer(str(tmp_path / "lf" / "vocab.txt"))
    pieces = lf.encode(texts)
    packed = [pack(ids, None, seq, lf.cls_id, lf.sep_id).tokens for ids in pieces]
    expected = [p + [lf.pad_id] * (seq - len(p)) for p in packed]
    path = export_preprocessor(BertTokenizer(str(tmp_path / "crlf" / "vocab.txt")),
                               str(tmp_path / "pre"), seq_length=seq)
    asset = os.path.join(path, "assets", "vocab.txt")
    assert open(asset, "rb").read().count(b"\r\n") == len(tokens)  # the file as given
    pythons = [sys.executable] + ([tf212_python()] if tf212_python() else [])
    for python in pythons:
        result = subprocess.run([python, "-c", _WINDOWS_VOCAB_PROBE, path, json.dumps(texts),
                                 asset], capture_output=True, text=True, timeout=600,
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        assert result.returncode == 0, result.stderr[-2000:]
        got = json.loads(result.stdout)
        assert np.asarray(got["ids"]).tolist() == np.asarray(expected).tolist(), got["version"]
        assert got["asset"] == pieces, got["version"]
    if len(pythons) == 1:
        pytest.skip("checked in this TensorFlow only: no tensorflow 2.12.1 interpreter (set "
                    "BERT_KERAS_TF212_PYTHON)")
