"""create_pretraining_data --dynamic_masking -> run_pretraining, end to end; recipe flags.

The masking itself is tested in test_masking.py; here: the data without masks and its
sidecar, training on it (MLM-only, whole words, a higher rate), exact resumption with masks
drawn in the pipeline, and one clear error for each combination that cannot work.
"""

import dataclasses
import json
import os
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl import flags
from absl.testing import flagsaver
from pretraining_data import write_dataset

from bert_keras.run_pretraining import (PretrainingError, PretrainingOptions,
                                        _warn_if_masked_otherwise, prepare_output_dir, train)
from data_prep import create_pretraining_data as cpd
from data_prep import features, files, schema

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = os.path.join(ROOT, "tests", "testdata", "pretrain_vocab.txt")
CORPUS = os.path.join(ROOT, "tests", "testdata", "pretrain_corpus.txt")
S = 32
V = len(schema.load_vocab(VOCAB))
CONFIG = dict(vocab_size=V, hidden_size=24, num_hidden_layers=2, num_attention_heads=2,
              intermediate_size=37, max_position_embeddings=40, hidden_dropout_prob=0.1,
              attention_probs_dropout_prob=0.1, hidden_act="gelu", type_vocab_size=2,
              initializer_range=0.02)


def run_cli(**flag_values):
    argv = ["create_pretraining_data"] + [f"--{k}={v}" for k, v in flag_values.items()]
    with flagsaver.flagsaver():
        flags.FLAGS.unparse_flags()
        flags.FLAGS(argv)
        return cpd.main(argv[:1])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dynamic")
    for name, seed in (("train", 1), ("eval", 2)):
        assert run_cli(input_file=CORPUS, vocab_file=VOCAB, output_file=str(directory / name),
                       num_output_shards=1, max_seq_length=S, dynamic_masking=True,
                       random_seed=seed, num_examples_to_print=1) == 0
    config = directory / "bert_config.json"
    config.write_text(json.dumps(CONFIG))
    return dict(dir=directory, train=str(directory / "train-00000-of-00001.tfrecord"),
                eval=str(directory / "eval-00000-of-00001.tfrecord"), config=str(config))


def _options(data, output_dir, **overrides):
    values = dict(input_file=data["train"], output_dir=str(output_dir),
                  bert_config_file=data["config"], vocab_file=VOCAB, max_seq_length=S,
                  train_batch_size=4, num_train_steps=6, num_warmup_steps=1,
                  learning_rate=1e-3, save_checkpoints_steps=3, autotune=False, verbose=0,
                  seed=11)
    values.update(overrides)
    return PretrainingOptions(**values)


def test_data_without_masks_and_its_sidecar(data):
    meta = features.read_sidecar(data["train"])
    assert meta["masking"] == "dynamic" and meta["max_predictions_per_seq"] is None
    assert meta["flags"]["dupe_factor"] == 1 and meta["flags"]["dynamic_masking"] is True
    assert sorted(meta["features"]) == sorted([schema.INPUT_IDS, schema.INPUT_MASK,
                                               schema.SEGMENT_IDS, schema.NEXT_SENTENCE_LABELS])
    records = list(tf.data.TFRecordDataset(data["train"]))
    assert len(records) == meta["shard"]["instances"] > 10
    example = tf.train.Example.FromString(records[0].numpy())
    assert sorted(example.features.feature) == sorted(meta["features"])
    parsed = features.parse_pretraining_example(tf.stack(records), S, None)
    ids = parsed["input_word_ids"].numpy()
    vocab = schema.load_vocab(VOCAB)
    assert not (ids == vocab.index("[MASK]")).any()  # unmasked text
    assert (ids[:, 0] == vocab.index("[CLS]")).all()
    # Google's reader, which wants the masked_lm_* features, cannot read it.
    with pytest.raises(tf.errors.InvalidArgumentError):
        features.parse_pretraining_example(records[0], S, 20)


def test_masking_flags_are_refused_with_dynamic_masking(data, tmp_path, capsys):
    for flag in ("masked_lm_prob=0.3", "max_predictions_per_seq=9", "do_whole_word_mask=true"):
        name, value = flag.split("=")
        code = run_cli(input_file=CORPUS, vocab_file=VOCAB, output_file=str(tmp_path / "x"),
                       dynamic_masking=True, **{name: value})
        assert code == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--{name} does not apply with --dynamic_masking" in err[0]
    assert not os.listdir(tmp_path)


@pytest.mark.integration  # ~24 s on 2 cores: make test's time (BUILD_NOTES 8.5)
def test_mlm_only_whole_words_higher_rate_end_to_end(data, tmp_path):
    options = _options(data, tmp_path / "out", masked_lm_prob=0.3, do_whole_word_mask=True,
                       next_sentence_prediction=False, eval_input_file=data["eval"],
                       eval_batch_size=4, max_eval_steps=2)
    logs = train(options)
    assert not any("nsp" in k for k in logs), logs  # no NSP loss or metric
    assert np.isfinite(logs["loss"]) and 0 <= logs["mlm_logits_accuracy"] <= 1
    assert np.isfinite(logs["val_loss"])
    recorded = json.load(open(tmp_path / "out" / files.RUN_CONFIG_FILE))
    # The derived prediction slots: ceil(32 * 0.3) = 10.
    assert recorded["masked_lm_prob"] == 0.3 and recorded["max_predictions_per_seq"] == 10
    assert recorded["next_sentence_prediction"] is False
    assert os.path.isfile(tmp_path / "out" / files.ENCODER_DIR / "encoder.weights.h5")
    # Evaluated alone without the masking flags, the run's model is masked as it trained
    # (0.3 of whole words) and gives the run's own final evaluation; before, 0.15 of single
    # WordPieces gave other numbers with no word.
    expected = json.load(open(tmp_path / "out" / "eval_results.json"))
    alone = train(_options(data, tmp_path / "alone", input_file=data["eval"],
                           init_checkpoint=str(tmp_path / "out"), do_train=False,
                           do_whole_word_mask=True, next_sentence_prediction=False,
                           bert_config_file=None, eval_batch_size=4, max_eval_steps=2))
    assert set(alone) == set(expected) - {"global_step"}  # MLM only: "loss", "accuracy"
    for name in alone:
        np.testing.assert_allclose(alone[name], expected[name], rtol=1e-5, err_msg=name)


@pytest.mark.integration  # two short runs: about 15 s on 2 cores
def test_a_phase_two_masking_otherwise_than_phase_one_is_warned_about(data, tmp_path, caplog):
    """Phase 1 at 0.3 of whole words, phase 2 on data without masks from its run directory
    without the masking flags: the flags are phase 2's own (0.15 of single WordPieces, as
    absl's defaults say), and a warning names the two that continue phase 1's recipe.
    Before, phase 2 silently masked otherwise. Its encoder/ and checkpoints name the same
    run; flags given are not warned about (whole words left out still are)."""
    phase_one = tmp_path / "phase1"
    short = dict(next_sentence_prediction=False, num_train_steps=2, save_checkpoints_steps=2)
    train(_options(data, phase_one, masked_lm_prob=0.3, do_whole_word_mask=True, **short))
    with caplog.at_level("WARNING"):
        train(_options(data, tmp_path / "phase2", init_checkpoint=str(phase_one),
                       bert_config_file=None, **short))
    expected = (" was trained with --masked_lm_prob=0.3 and --do_whole_word_mask (its "
                f"{files.RUN_CONFIG_FILE}); this run masks with --masked_lm_prob=0.15 (the "
                "default) and single WordPieces: pass --masked_lm_prob=0.3 "
                "--do_whole_word_mask to continue its recipe")
    assert f"--init_checkpoint {phase_one}{expected}" in caplog.text
    recorded = json.load(open(tmp_path / "phase2" / files.RUN_CONFIG_FILE))
    assert recorded["masked_lm_prob"] == 0.15 and not recorded["do_whole_word_mask"]

    def warned(source, prob_given=False, **resolved):
        """What phase 2 from `source` says, given its resolved masking flags."""
        caplog.clear()
        with caplog.at_level("WARNING"):
            _warn_if_masked_otherwise(_options(data, tmp_path / "unused",
                                               init_checkpoint=str(source), **resolved),
                                      prob_given)
        return caplog.text

    ckpt = sorted((phase_one / "checkpoints").glob("ckpt-*.weights.h5"))[-1]
    for source in (phase_one / "encoder", ckpt):
        assert f"--init_checkpoint {source}{expected}" in warned(source, masked_lm_prob=0.15)
    assert warned(phase_one, True, masked_lm_prob=0.3, do_whole_word_mask=True) == ""
    assert warned(phase_one, False, masked_lm_prob=0.3, do_whole_word_mask=True) == ""
    rate_given = warned(phase_one, True, masked_lm_prob=0.2)
    assert ("this run masks with single WordPieces: pass --do_whole_word_mask to continue "
            "its recipe") in rate_given and "0.2" not in rate_given
    assert warned(tmp_path / "phase2", masked_lm_prob=0.15) == ""  # masked as it was


class _Crash(Exception):
    pass


class _CrashInSecondInterval(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 1 and batch == 1:
            raise _Crash()


def _weights(path):
    import h5py

    arrays = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: arrays.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    return arrays


@pytest.mark.integration  # Three short runs and a crash: about a minute on 2 cores.
def test_resume_with_dynamic_masks_is_bit_identical(data, tmp_path):
    """Masks are a function of (seed, batch position): a killed and rerun run trains on the
    same masks as an uninterrupted one and ends with the same weights."""
    reference = _options(data, tmp_path / "ref", deterministic=True)
    train(reference)
    options = dataclasses.replace(reference, output_dir=str(tmp_path / "out"))
    with pytest.raises(_Crash):
        train(options, extra_callbacks=[_CrashInSecondInterval()])
    train(options)
    got = _weights(tmp_path / "out" / files.PRETRAINER_WEIGHTS_FILE)
    want = _weights(tmp_path / "ref" / files.PRETRAINER_WEIGHTS_FILE)
    assert got.keys() == want.keys()
    assert max(float(np.abs(got[k] - want[k]).max()) for k in want) == 0.0
    # Another seed masks (and orders) differently: other weights. Held out: statically
    # masked data at its own P (3; training derives 5), as when every recipe is scored on
    # the same masks.
    static = write_dataset(tmp_path, num_files=1, per_file=8, max_seq_length=S,
                           max_predictions_per_seq=3, vocab_size=V, prefix="heldout")
    other = dataclasses.replace(reference, output_dir=str(tmp_path / "other"), seed=12,
                                eval_input_file=static, eval_batch_size=4, max_eval_steps=2)
    logs = train(other)
    assert np.isfinite(logs["val_mlm_logits_accuracy"])
    moved = _weights(tmp_path / "other" / files.PRETRAINER_WEIGHTS_FILE)
    assert max(float(np.abs(moved[k] - want[k]).max()) for k in want) > 0


def test_combinations_that_cannot_work_are_refused(data, tmp_path):
    static = write_dataset(tmp_path, num_files=1, per_file=8, max_seq_length=S,
                           max_predictions_per_seq=5, vocab_size=V)
    # Data whose sidecar names a vocabulary no longer there (else that one is used).
    moved = str(tmp_path / "moved.tfrecord")
    shutil.copy(data["train"], moved)
    features.write_sidecar(moved, dict(features.read_sidecar(data["train"]),
                                       vocab_file=str(tmp_path / "gone" / "vocab.txt")))
    cases = [
        (dict(input_file=static, max_predictions_per_seq=5, masked_lm_prob=0.3),
         "--masked_lm_prob applies to data without masks"),
        (dict(input_file=static, max_predictions_per_seq=5, do_whole_word_mask=True),
         "--do_whole_word_mask applies to data without masks"),
        (dict(vocab_file=None, input_file=moved), "pass --vocab_file"),
        (dict(masked_lm_prob=0.3, max_predictions_per_seq=6),
         r"--max_predictions_per_seq=6 would cap --masked_lm_prob=0.3 .* needs 9"),
        (dict(masked_lm_prob=1.5), r"--masked_lm_prob must be in \(0, 1\]"),
        (dict(input_file=f"{data['train']},{static}"), "mix statically masked data"),
    ]
    for overrides, message in cases:
        with pytest.raises(PretrainingError, match=message):
            train(_options(data, tmp_path / "never", **overrides))
        assert not os.path.exists(tmp_path / "never")


def test_runs_recorded_before_the_recipe_flags_resume(data, tmp_path):
    options = dataclasses.replace(_options(data, tmp_path / "out"), max_predictions_per_seq=20)
    os.makedirs(options.output_dir)
    recorded = options.run_identity()
    for name in ("masked_lm_prob", "do_whole_word_mask", "next_sentence_prediction"):
        recorded.pop(name)
    files.write_json(os.path.join(options.output_dir, files.RUN_CONFIG_FILE), recorded)
    assert prepare_output_dir(options, chief=True) is True
    with pytest.raises(PretrainingError, match="next_sentence_prediction: True -> False"):
        prepare_output_dir(dataclasses.replace(options, next_sentence_prediction=False), True)
