"""Pretraining input pipeline: shapes, file checks, determinism, skipping, sharding."""

import numpy as np
import pytest
import tensorflow as tf
from pretraining_data import make_instances, write_dataset, write_records

from bert_keras.inputs import pretraining_dataset
from data_prep import features

# Lengths that differ from each other and from the batch size.
S, P, BATCH = 14, 3, 5


def _ids(dataset, batches):
    return [x["input_word_ids"].numpy() for x, _, _ in dataset.take(batches)]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pretraining")
    write_dataset(directory, num_files=3, per_file=12, max_seq_length=S, max_predictions_per_seq=P)
    return directory


def test_elements_fit_the_pretrainer(data_dir):
    dataset = pretraining_dataset(f"{data_dir}/train-*", BATCH, S, P, seed=1, autotune=False)
    x, y, w = dataset.element_spec
    assert {k: (tuple(v.shape), v.dtype) for k, v in x.items()} == {
        "input_word_ids": ((BATCH, S), tf.int32), "input_mask": ((BATCH, S), tf.int32),
        "input_type_ids": ((BATCH, S), tf.int32), "masked_lm_positions": ((BATCH, P), tf.int32)}
    assert {k: (tuple(v.shape), v.dtype) for k, v in y.items()} == {
        "mlm_logits": ((BATCH, P), tf.int32), "nsp_logits": ((BATCH,), tf.int32)}
    assert {k: (tuple(v.shape), v.dtype) for k, v in w.items()} == {
        "mlm_logits": ((BATCH, P), tf.float32), "nsp_logits": ((BATCH,), tf.float32)}
    x, y, w = next(iter(dataset))
    # Labels are the original ids at the masked positions; padding slots have weight 0.
    assert set(np.unique(w["mlm_logits"].numpy())) <= {0.0, 1.0}
    assert (y["mlm_logits"].numpy()[w["mlm_logits"].numpy() == 0] == 0).all()
    assert (w["nsp_logits"].numpy() == 1).all()


def test_repeats_and_drops_the_remainder(data_dir):
    # 36 records, batch 5: one pass gives 7 full batches; training repeats forever.
    once = pretraining_dataset(f"{data_dir}/train-*", BATCH, S, P, is_training=False,
                               autotune=False)
    assert sum(1 for _ in once) == 7
    forever = pretraining_dataset(f"{data_dir}/train-*", BATCH, S, P, seed=1, autotune=False)
    assert len(_ids(forever, 20)) == 20


def test_order_is_deterministic_and_skip_resumes_it(data_dir):
    pattern = f"{data_dir}/train-*"
    first = _ids(pretraining_dataset(pattern, BATCH, S, P, seed=7, autotune=False), 12)
    again = _ids(pretraining_dataset(pattern, BATCH, S, P, seed=7, autotune=False), 12)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    # Past the first pass over the data (7 batches), so reshuffled epochs are covered too.
    resumed = _ids(pretraining_dataset(pattern, BATCH, S, P, seed=7, autotune=False,
                                       skip_batches=9), 3)
    for a, b in zip(first[9:], resumed):
        np.testing.assert_array_equal(a, b)
    other = _ids(pretraining_dataset(pattern, BATCH, S, P, seed=8, autotune=False), 12)
    assert any((a != b).any() for a, b in zip(first, other))


@pytest.mark.parametrize("num_files", [3, 1])
def test_input_pipelines_read_disjoint_shares(tmp_path, num_files):
    # 3 files for 2 pipelines: whole files per pipeline; 1 file: every other record.
    per_file = 12 if num_files == 3 else 20
    pattern = write_dataset(tmp_path, num_files=num_files, per_file=per_file, max_seq_length=S,
                            max_predictions_per_seq=P)
    shares = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline,
                                             num_replicas_in_sync=2)
        dataset = pretraining_dataset(pattern, 1, S, P, is_training=False, input_context=context,
                                      autotune=False)
        shares.append({tuple(x["input_word_ids"].numpy()[0]) for x, _, _ in dataset})
    everything = pretraining_dataset(pattern, 1, S, P, is_training=False, autotune=False)
    all_records = {tuple(x["input_word_ids"].numpy()[0]) for x, _, _ in everything}
    assert shares[0] and shares[1] and not shares[0] & shares[1]
    assert shares[0] | shares[1] == all_records


def test_sidecar_mismatch_fails_naming_file_and_lengths(data_dir):
    with pytest.raises(ValueError) as error:
        pretraining_dataset(f"{data_dir}/train-*", BATCH, 128, P)
    message = str(error.value)
    assert "train-0.tfrecord" in message
    assert f"max_seq_length={S}" in message and "max_seq_length=128" in message


def test_reads_files_without_sidecar_like_googles(tmp_path):
    """Google's create_pretraining_data.py writes the same features and no sidecar."""
    instances = make_instances(10, S, P, vocab_size=99, seed=3)
    path = write_records(tmp_path / "google.tfrecord", instances, sidecar=None)
    assert features.read_sidecar(path) is None
    dataset = pretraining_dataset(path, 10, S, P, is_training=False, autotune=False)
    x, y, w = next(iter(dataset))
    np.testing.assert_array_equal(x["input_word_ids"].numpy(), instances["input_ids"])
    np.testing.assert_array_equal(x["input_type_ids"].numpy(), instances["segment_ids"])
    np.testing.assert_array_equal(y["mlm_logits"].numpy(), instances["masked_lm_ids"])
    np.testing.assert_array_equal(y["nsp_logits"].numpy(), instances["next_sentence_labels"])
    np.testing.assert_array_equal(w["mlm_logits"].numpy(), instances["masked_lm_weights"])


def test_file_without_sidecar_and_other_lengths_fails_clearly(tmp_path):
    instances = make_instances(2, 20, 4, vocab_size=99)
    path = write_records(tmp_path / "google512.tfrecord", instances, sidecar=None)
    with pytest.raises(ValueError) as error:
        pretraining_dataset(path, 2, S, P)
    message = str(error.value)
    assert "google512.tfrecord" in message and "no sidecar" in message
    assert "input_ids of length 20" in message and "masked_lm_positions of length 4" in message


def test_gzip_files_are_read(tmp_path):
    instances = make_instances(6, S, P, vocab_size=99, seed=4)
    path = write_records(tmp_path / "zipped.tfrecord", instances, sidecar=None, compression="GZIP")
    x, _, _ = next(iter(pretraining_dataset(path, 6, S, P, is_training=False, autotune=False)))
    np.testing.assert_array_equal(x["input_word_ids"].numpy(), instances["input_ids"])


def test_no_matching_file_fails_clearly(tmp_path):
    with pytest.raises(ValueError, match="matches no data file"):
        pretraining_dataset(f"{tmp_path}/nothing-*", BATCH, S, P)


def test_check_integrity_refuses_or_skips_damaged_files(tmp_path):
    from bert_keras.inputs import check_integrity

    pattern = write_dataset(tmp_path, num_files=3, per_file=12, max_seq_length=S,
                            max_predictions_per_seq=P)
    paths = features.expand_input_files(pattern)
    assert check_integrity(paths) == paths
    with open(paths[1], "r+b") as f:
        f.truncate(int(f.seek(0, 2) * 0.6))
    with pytest.raises(features.DamagedDataError, match=r"train-1.tfrecord is damaged.*"
                                                        r"expected 12 records"):
        check_integrity(paths)
    skipped = []
    assert check_integrity(paths, skip_damaged=True, warn=skipped.append) == [paths[0], paths[2]]
    assert len(skipped) == 1 and "train-1.tfrecord" in skipped[0]
    with pytest.raises(features.DamagedDataError, match="all 1 data files are damaged"):
        check_integrity([paths[1]], skip_damaged=True, warn=skipped.append)


def test_every_iterator_yields_the_same_stream(data_dir):
    """Keras' fit under a tf.distribute strategy takes a batch from one iterator to build the
    model and trains on a second one; with reshuffle_each_iteration the second stream differed
    from the first, so a resumed run (which skips batches of a fresh dataset) read other data
    than the run it resumed (max |dw| 3.2e-3 under MirroredStrategy on 2 CPUs)."""
    dataset = pretraining_dataset(f"{data_dir}/train-*", BATCH, S, P, seed=7, autotune=False)
    first, second = iter(dataset), iter(dataset)
    a = [next(first)[0]["input_word_ids"].numpy() for _ in range(10)]
    b = [next(second)[0]["input_word_ids"].numpy() for _ in range(10)]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    # Yet the stream does not repeat itself pass after pass (36 records: 7 batches a pass).
    assert not np.array_equal(np.concatenate(a[0:3]), np.concatenate(a[7:10]))
