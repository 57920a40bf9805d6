"""data_prep.features: the TFRecord schema, the fast writer, the name bridge, sidecars."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from data_prep import features

# Sizes that all differ, so a swapped length cannot pass.
S, P = 13, 5

# The schema written out independently of data_prep.features (docs/DESIGN.md section 4).
GOOGLE_SPEC = {
    "input_ids": tf.io.FixedLenFeature([S], tf.int64),
    "input_mask": tf.io.FixedLenFeature([S], tf.int64),
    "segment_ids": tf.io.FixedLenFeature([S], tf.int64),
    "masked_lm_positions": tf.io.FixedLenFeature([P], tf.int64),
    "masked_lm_ids": tf.io.FixedLenFeature([P], tf.int64),
    "masked_lm_weights": tf.io.FixedLenFeature([P], tf.float32),
    "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
}


def _random_batch(n, s=S, p=P, seed=0, big=False):
    rng = np.random.default_rng(seed)
    high = 2**31 - 1 if big else 30522
    ids = rng.integers(0, high, (n, s))
    ids[:, -2:] = 0
    mask = (ids > 0).astype(np.int64)
    seg = rng.integers(0, 2, (n, s))
    pos = np.sort(rng.integers(0, s, (n, p)), axis=1)
    mlm = rng.integers(0, high, (n, p))
    weights = (rng.random((n, p)) < 0.7).astype(np.float32)
    nsp = rng.integers(0, 2, n)
    return ids, mask, seg, pos, mlm, weights, nsp


def test_feature_spec_matches_independent_spec():
    spec = features.feature_spec(S, P)
    assert set(spec) == set(GOOGLE_SPEC)
    for name, want in GOOGLE_SPEC.items():
        got = spec[name]
        assert got.dtype == want.dtype, name
        assert list(got.shape) == list(want.shape), name
        assert got.default_value is None, name  # FixedLen: every feature must be present


@pytest.mark.parametrize("big", [False, True])
def test_fast_writer_equals_reference_writer(big):
    batch = _random_batch(9, big=big, seed=int(big))
    records = features.serialize_examples(*batch)
    assert len(records) == 9
    for i, record in enumerate(records):
        want = features.to_example(*(a[i] for a in batch[:6]), int(batch[6][i]))
        got = tf.train.Example.FromString(record)
        assert got == want
        # Parsed with the independent spec, every value survives.
        parsed = tf.io.parse_single_example(record, GOOGLE_SPEC)
        np.testing.assert_array_equal(parsed["input_ids"].numpy(), batch[0][i])
        np.testing.assert_array_equal(parsed["masked_lm_ids"].numpy(), batch[4][i])
        np.testing.assert_array_equal(parsed["masked_lm_weights"].numpy(), batch[5][i])
        assert parsed["next_sentence_labels"].numpy().tolist() == [batch[6][i]]


def test_fast_writer_edge_sizes():
    # P = 1, every value < 128 (one-byte varints), and an empty batch.
    batch = _random_batch(3, s=5, p=1, seed=3)
    batch = tuple(np.minimum(a, 127) if a.dtype != np.float32 else a for a in batch)
    for i, record in enumerate(features.serialize_examples(*batch)):
        assert tf.train.Example.FromString(record) == features.to_example(
            *(a[i] for a in batch[:6]), int(batch[6][i]))
    assert features.serialize_examples(*_random_batch(0)) == []


def test_fast_writer_rejects_bad_input():
    ids, mask, seg, pos, mlm, weights, nsp = _random_batch(2)
    with pytest.raises(ValueError, match="masked_lm_ids has shape"):
        features.serialize_examples(ids, mask, seg, pos, mlm[:, :2], weights, nsp)
    with pytest.raises(ValueError, match="outside"):
        features.serialize_examples(-ids, mask, seg, pos, mlm, weights, nsp)


def test_parse_renames_and_casts_scalar_and_batch():
    batch = _random_batch(4, seed=5)
    records = features.serialize_examples(*batch)
    one = features.parse_pretraining_example(tf.constant(records[0]), S, P)
    many = features.parse_pretraining_example(tf.constant(records), S, P)
    want_names = {"input_word_ids", "input_mask", "input_type_ids", "masked_lm_positions",
                  "masked_lm_ids", "masked_lm_weights", "next_sentence_labels"}
    assert set(one) == set(many) == want_names
    for name, value in many.items():
        want_dtype = tf.float32 if name == "masked_lm_weights" else tf.int32
        assert value.dtype == want_dtype, name
        assert one[name].dtype == want_dtype, name
    assert many["input_word_ids"].shape == (4, S)
    assert one["input_type_ids"].shape == (S,)
    assert many["masked_lm_positions"].shape == (4, P)
    assert many["next_sentence_labels"].shape == (4, 1)
    np.testing.assert_array_equal(many["input_type_ids"].numpy(), batch[2])
    np.testing.assert_array_equal(one["input_word_ids"].numpy(), batch[0][0])
    with pytest.raises(ValueError, match="scalar or a \\[batch\\]"):
        features.parse_pretraining_example(tf.constant([records[:2]]), S, P)


def test_parse_in_a_dataset_after_batching(tmp_path):
    path = str(tmp_path / "x.tfrecord")
    batch = _random_batch(6, seed=7)
    with tf.io.TFRecordWriter(path) as w:
        for r in features.serialize_examples(*batch):
            w.write(r)
    ds = tf.data.TFRecordDataset([path]).batch(4, drop_remainder=True).map(
        lambda x: features.parse_pretraining_example(x, S, P))
    (first,) = list(ds)
    assert first["input_word_ids"].shape == (4, S)
    np.testing.assert_array_equal(first["masked_lm_ids"].numpy(), batch[4][:4])


def test_sidecar_round_trip_and_check(tmp_path):
    shard = str(tmp_path / "data.tfrecord")
    assert features.read_sidecar(shard) is None
    path = features.write_sidecar(shard, {"max_seq_length": 128, "max_predictions_per_seq": 20})
    assert path == shard + ".meta.json"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".incomplete")]
    meta = features.read_sidecar(shard)
    assert meta["max_seq_length"] == 128
    features.check_sidecar(meta, 128, 20, shard)
    features.check_sidecar(None, 512, 80, shard)  # no sidecar: nothing to check
    with pytest.raises(ValueError) as err:
        features.check_sidecar(meta, 512, 20, shard)
    message = str(err.value)
    assert message == (f"pretraining data {shard} does not match the trainer: it was written "
                       "with max_seq_length=128 but the trainer uses --max_seq_length=512. "
                       "Regenerate the data with matching flags or change the trainer's flags.")
    with pytest.raises(ValueError, match=r"its sidecar has no max_predictions_per_seq \(the "
                                         r"trainer uses --max_predictions_per_seq=20\)"):
        features.check_sidecar({"max_seq_length": 128}, 128, 20, shard)
    with open(path, "w") as f:
        f.write("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        features.read_sidecar(shard)


def test_expand_input_files(tmp_path):
    for name in ["b.tfrecord", "a.tfrecord", "a.tfrecord.meta.json", ".c.tfrecord.incomplete",
                 "other.txt"]:
        (tmp_path / name).write_text("x")
    got = features.expand_input_files(f"{tmp_path}/*.tfrecord*,{tmp_path}/other.txt")
    assert got == sorted([str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord"),
                          str(tmp_path / "other.txt")])
    one = str(tmp_path / "a.tfrecord")
    assert features.expand_input_files([one]) == [one]
    with pytest.raises(ValueError, match="nothing-here"):
        features.expand_input_files(f"{tmp_path}/a.tfrecord,{tmp_path}/nothing-here*")
    with pytest.raises(ValueError, match="matches no data file"):
        features.expand_input_files(f"{tmp_path}/*.meta.json")


def test_one_file_and_a_shard_set_of_one_prefix_are_refused(tmp_path):
    """Two outputs of create_pretraining_data at one prefix (x.tfrecord from a run without
    --num_output_shards, x-NNNNN-of-00002.tfrecord from one with it; the writer now refuses
    to add the second beside the first, but older runs left both): a glob x* gathered
    them, and every example was read twice. Refused as two shard sets are, naming both."""
    for name in ("x.tfrecord", "x.tfrecord.gz", "x-00000-of-00002.tfrecord",
                 "x-00001-of-00002.tfrecord", "xy.tfrecord"):
        (tmp_path / name).write_bytes(b"")
    prefix = tmp_path / "x"
    gathered = features.expand_input_files(str(tmp_path / "x*.tfrecord"))
    assert len(gathered) == 4  # the glob does gather them
    with pytest.raises(ValueError) as e:
        features.check_shard_sets(gathered)
    assert str(e.value).startswith(
        f"pretraining files hold two outputs of the output prefix {prefix}, "
        f"{prefix}-*-of-00002.tfrecord (e.g. {prefix}-00000-of-00002.tfrecord) and "
        f"{prefix}.tfrecord: the corpus written twice"), str(e.value)
    with pytest.raises(ValueError, match=rf"two outputs of the output prefix {prefix}, "
                                         rf"{prefix}.tfrecord and {prefix}.tfrecord.gz:"):
        features.check_shard_sets([str(tmp_path / "x.tfrecord"), str(tmp_path / "x.tfrecord.gz")])
    # one output of the prefix, whatever else is read beside it, is read as before
    for pattern in ("x-*.tfrecord", "x.tfrecord,xy.tfrecord", "x-*.tfrecord,xy.tfrecord"):
        features.check_shard_sets(features.expand_input_files(
            ",".join(str(tmp_path / p) for p in pattern.split(","))))


def test_compression_type(tmp_path):
    batch = _random_batch(2)
    for compression in ["", "GZIP"]:
        path = str(tmp_path / f"x{compression}.tfrecord")
        with tf.io.TFRecordWriter(path, tf.io.TFRecordOptions(compression_type=compression)) as w:
            for r in features.serialize_examples(*batch):
                w.write(r)
        assert features.compression_type(path) == compression
        features.write_sidecar(path, {"compression": compression})
        assert features.compression_type(path) == compression
        assert json.load(open(path + ".meta.json"))["compression"] == compression


# --- Integrity: record framing to the end of the file, counts against the sidecar. ---


def _write_records(path, sizes, compression=""):
    rng = np.random.default_rng(len(sizes))
    with tf.io.TFRecordWriter(str(path), tf.io.TFRecordOptions(compression_type=compression)) as w:
        for size in sizes:
            w.write(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    return str(path)


def _cut(path, fraction=None, size=None):
    data = open(path, "rb").read()
    cut = data[: int(len(data) * fraction) if size is None else size]
    with open(path, "wb") as f:
        f.write(cut)


def test_length_checksum_matches_tensorflows(tmp_path):
    sizes = [0, 1, 127, 128, 300, 70000]
    path = _write_records(tmp_path / "x.tfrecord", sizes)
    data = open(path, "rb").read()
    offset = 0
    for size in sizes:
        length, crc = np.frombuffer(data[offset:offset + 8], "<u8")[0], data[offset + 8:offset + 12]
        assert int(length) == size
        assert features.masked_crc32c_of_uint64(size) == int.from_bytes(crc, "little")
        offset += size + 16
    assert features.scan_tfrecord(path) == features.RecordScan(path, len(sizes))


@pytest.mark.parametrize("compression", ["", "GZIP"])
def test_a_cut_shard_is_found(tmp_path, compression):
    """The issue's case: a shard cut to 60% of its size, as an interrupted copy leaves it."""
    path = _write_records(tmp_path / "x.tfrecord", [301] * 99, compression)
    _cut(path, 0.6)
    scan = features.scan_tfrecord(path, compression)
    assert scan.problem is not None and scan.records <= 59, scan
    with pytest.raises(features.DamagedDataError) as e:
        features.check_shard(path, {"shard": {"instances": 99}}, compression)
    message = str(e.value)
    assert "\n" not in message and path in message
    assert f"expected 99 records (its sidecar), found {scan.records}" in message


def test_cuts_inside_a_header_and_on_a_record_boundary(tmp_path):
    path = _write_records(tmp_path / "x.tfrecord", [100] * 10)
    _cut(path, size=5 * 116 + 5)
    scan = features.scan_tfrecord(path)
    assert scan.records == 5 and "header of record 6" in scan.problem
    _cut(path, size=5 * 116)  # On a boundary: only the sidecar's count can tell.
    assert features.scan_tfrecord(path) == features.RecordScan(path, 5)
    features.check_shard(path, None)  # No sidecar (Google's files): the framing is sound.
    with pytest.raises(features.DamagedDataError, match="expected 10 records .*found 5"):
        features.check_shard(path, {"shard": {"instances": 10}})


def test_a_corrupt_length_header_is_found(tmp_path):
    path = _write_records(tmp_path / "x.tfrecord", [100] * 10)
    data = bytearray(open(path, "rb").read())
    data[3 * 116 + 1] ^= 0x40  # A flipped bit in record 4's length.
    open(path, "wb").write(bytes(data))
    scan = features.scan_tfrecord(path)
    assert scan.records == 3 and "length header of record 4 is corrupt" in scan.problem


def test_gzip_corruption_and_empty_files(tmp_path):
    path = _write_records(tmp_path / "x.tfrecord.gz", [100] * 50, "GZIP")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    assert "GZIP" in features.scan_tfrecord(path, "GZIP").problem
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    for compression in ("", "GZIP"):
        assert features.scan_tfrecord(str(empty), compression).problem is None
    with pytest.raises(features.DamagedDataError, match="expected 3 records .*found 0"):
        features.check_shard(str(empty), {"shard": {"instances": 3}})
