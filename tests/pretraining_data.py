"""Tiny pretraining TFRecords for tests, written through data_prep.features (the one schema)."""

import numpy as np
import tensorflow as tf

from data_prep import features


def make_instances(num, max_seq_length, max_predictions_per_seq, vocab_size, seed=0):
    """Random but well-formed instances: numpy arrays keyed by the schema's file names.

    Sequences are [CLS]=1 A [SEP]=2 B [SEP]=2 with random lengths and 0 padding; between 1 and
    max_predictions_per_seq ascending masked positions (never [CLS]/[SEP]) whose original ids
    are the labels; the rest of the masked_lm_* slots are 0 with weight 0.
    """
    rng = np.random.default_rng(seed)
    s, p = max_seq_length, max_predictions_per_seq
    ids = np.zeros((num, s), np.int64)
    mask = np.zeros((num, s), np.int64)
    types = np.zeros((num, s), np.int64)
    positions = np.zeros((num, p), np.int64)
    labels = np.zeros((num, p), np.int64)
    weights = np.zeros((num, p), np.float32)
    nsp = rng.integers(0, 2, size=num)
    for i in range(num):
        length = int(rng.integers(max(5, s // 2), s + 1))
        split = int(rng.integers(2, length - 2))
        tokens = rng.integers(3, vocab_size, size=length)
        tokens[0], tokens[split], tokens[length - 1] = 1, 2, 2
        ids[i, :length], mask[i, :length] = tokens, 1
        types[i, split + 1 : length] = 1
        candidates = [j for j in range(1, length - 1) if j != split]
        count = int(rng.integers(1, min(p, len(candidates)) + 1))
        chosen = np.sort(rng.choice(candidates, size=count, replace=False))
        positions[i, :count], labels[i, :count], weights[i, :count] = chosen, tokens[chosen], 1.0
        ids[i, chosen] = 3  # The "[MASK]" id of these tests.
    return {
        features.INPUT_IDS: ids, features.INPUT_MASK: mask, features.SEGMENT_IDS: types,
        features.MASKED_LM_POSITIONS: positions, features.MASKED_LM_IDS: labels,
        features.MASKED_LM_WEIGHTS: weights, features.NEXT_SENTENCE_LABELS: nsp,
    }


def write_records(path, instances, sidecar=None, compression=""):
    """Writes `instances` (from make_instances) to a TFRecord file; sidecar: dict or None.

    The records are built with `features.to_example`, like a reference writer; without a
    sidecar the file looks like one from Google's create_pretraining_data.py.
    """
    num = len(instances[features.INPUT_IDS])
    options = tf.io.TFRecordOptions(compression_type=compression)
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for i in range(num):
            example = features.to_example(
                instances[features.INPUT_IDS][i], instances[features.INPUT_MASK][i],
                instances[features.SEGMENT_IDS][i], instances[features.MASKED_LM_POSITIONS][i],
                instances[features.MASKED_LM_IDS][i], instances[features.MASKED_LM_WEIGHTS][i],
                int(instances[features.NEXT_SENTENCE_LABELS][i]))
            writer.write(example.SerializeToString())
    if sidecar is not None:
        features.write_sidecar(str(path), sidecar)
    return str(path)


def write_dataset(directory, num_files=2, per_file=16, max_seq_length=16,
                  max_predictions_per_seq=4, vocab_size=99, sidecar=True, seed=0, prefix="train"):
    """Writes num_files shards `<prefix>-<i>.tfrecord` (+ sidecars); returns their glob."""
    for i in range(num_files):
        instances = make_instances(per_file, max_seq_length, max_predictions_per_seq, vocab_size,
                                   seed=seed * 1000 + i)
        meta = {"max_seq_length": max_seq_length,
                "max_predictions_per_seq": max_predictions_per_seq,
                "shard": {"index": i, "num_shards": num_files,
                          "instances": per_file}} if sidecar else None
        write_records(f"{directory}/{prefix}-{i}.tfrecord", instances, meta)
    return f"{directory}/{prefix}-*.tfrecord"
