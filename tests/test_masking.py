"""Dynamic masking (bert_keras/masking.py) and its place in the input pipeline.

Checked against independent references: the budget min(P, ceil(n * rate)) computed by hand
per row, binomial bounds for the 80/10/10 split, words recomputed in Python from the
vocabulary's "##" prefix, and the unmasked data the masks were applied to.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from bert_keras import masking
from bert_keras.inputs import input_masking, pretraining_dataset
from data_prep import features

# Specials at ids no code may assume; [PAD] at 0 as in every padded file.
VOCAB = (["[PAD]"] + [f"w{i}" for i in range(1, 7)] + ["[UNK]"] + [f"w{i}" for i in range(8, 11)]
         + ["[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(14, 71)]
         + [f"##c{i}" for i in range(71, 97)])
V = len(VOCAB)  # 97
CLS, SEP, MASK = VOCAB.index("[CLS]"), VOCAB.index("[SEP]"), VOCAB.index("[MASK]")
SPECIAL = {0, CLS, SEP}
WORD_IDS = [i for i, t in enumerate(VOCAB) if not t.startswith(("[", "##"))]
PIECE_IDS = [i for i, t in enumerate(VOCAB) if t.startswith("##")]


def make_batch(num, seq_length, seed=0, pieces=0.3):
    """Unmasked rows [CLS] A [SEP] B [SEP] + 0 padding, with "##" pieces after some words.

    Returns (input_ids int32 [N, S], input_mask int32 [N, S], segment_ids, nsp [N, 1]).
    """
    rng = np.random.default_rng(seed)
    ids = np.zeros((num, seq_length), np.int32)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for i in range(num):
        length = int(rng.integers(6, seq_length + 1))
        split = int(rng.integers(2, length - 2))
        for j in range(1, length - 1):
            after_word = j > 1 and j != split + 1 and ids[i, j - 1] not in (CLS, SEP)
            ids[i, j] = rng.choice(PIECE_IDS if after_word and rng.random() < pieces
                                   else WORD_IDS)
        ids[i, 0], ids[i, split], ids[i, length - 1] = CLS, SEP, SEP
        mask[i, :length] = 1
        types[i, split + 1:length] = 1
    return ids, mask, types, rng.integers(0, 2, (num, 1)).astype(np.int32)


def run_mask(ids, mask, prob=0.15, p=20, whole_word=False, seed=(1, 2)):
    config = masking.DynamicMasking.from_vocab(VOCAB, prob, p, whole_word)
    out = masking.mask_batch(tf.constant(ids), tf.constant(mask), config,
                             tf.constant(seed, tf.int64))
    return {k: v.numpy() for k, v in out.items()}


def reference_words(row):
    """Word spans [(start, end)] of one row's selectable pieces, from the "##" prefix."""
    spans = []
    for j, t in enumerate(row.tolist()):
        if t in SPECIAL:
            continue
        continues = VOCAB[t].startswith("##") and j > 0 and row[j - 1] not in SPECIAL
        if continues and spans:
            spans[-1] = (spans[-1][0], j + 1)
        else:
            spans.append((j, j + 1))
    return spans


def test_vocabulary_lookup():
    config = masking.DynamicMasking.from_vocab(VOCAB, 0.3, 7)
    assert (config.vocab_size, config.mask_id) == (V, MASK)
    assert set(config.unselectable_ids) == {CLS, SEP, 0}
    assert config.continuation_ids == tuple(PIECE_IDS)
    assert masking.derived_max_predictions(128, 0.15) == 20  # Google's pair for 128
    assert masking.derived_max_predictions(128, 0.3) == 39
    assert masking.budget(10, 0.3, 20) == 3  # 0.3 * 10 = 3.0000000000000004 in float64


@pytest.mark.parametrize("prob,p", [(0.15, 20), (0.4, 9)])
def test_budget_positions_labels_and_specials(prob, p):
    ids, mask, _, _ = make_batch(64, 37, seed=1)
    out = run_mask(ids, mask, prob, p)
    total_masked = total_selectable = 0
    for i in range(len(ids)):
        length = int(mask[i].sum())
        selectable = length - 3
        k = int(out["masked_lm_weights"][i].sum())
        assert k == min(p, math.ceil(selectable * prob - 1e-9)), i  # the budget, row by row
        assert not out["masked_lm_weights"][i, k:].any()
        positions = out["masked_lm_positions"][i, :k]
        assert (np.diff(positions) > 0).all() and not out["masked_lm_positions"][i, k:].any()
        assert all(ids[i, q] not in SPECIAL and q < length for q in positions)
        np.testing.assert_array_equal(out["masked_lm_ids"][i, :k], ids[i, positions])
        assert not out["masked_lm_ids"][i, k:].any()
        untouched = np.setdiff1d(np.arange(37), positions)
        np.testing.assert_array_equal(out["input_word_ids"][i, untouched], ids[i, untouched])
        total_masked += k
        total_selectable += selectable
    # The share: the rate, plus less than one rounded-up prediction per row.
    if p >= 20:
        assert prob <= total_masked / total_selectable <= prob + len(ids) / total_selectable


def test_replacements_split_80_10_10():
    counts = {"mask": 0, "same": 0, "random": 0}
    random_ids = []
    n = 0
    for seed in range(4):
        ids, mask, _, _ = make_batch(256, 64, seed=10 + seed)
        out = run_mask(ids, mask, 0.3, 20, seed=(seed, 5))
        w = out["masked_lm_weights"] > 0
        shown = np.take_along_axis(out["input_word_ids"], out["masked_lm_positions"], 1)[w]
        truth = out["masked_lm_ids"][w]
        counts["mask"] += int((shown == MASK).sum())
        counts["same"] += int((shown == truth).sum())
        other = (shown != MASK) & (shown != truth)
        counts["random"] += int(other.sum())
        random_ids.append(shown[other])
        n += int(w.sum())
    assert n > 8000
    # A random id equals the original (or [MASK]) with probability 1/V each.
    expected = {"mask": 0.8 + 0.1 / V, "same": 0.1 + 0.1 / V, "random": 0.1 * (1 - 2 / V)}
    for kind, share in expected.items():
        sd = math.sqrt(share * (1 - share) / n)
        assert abs(counts[kind] / n - share) <= 4.5 * sd, (kind, counts[kind] / n)
    random_ids = np.concatenate(random_ids)
    assert random_ids.min() >= 0 and random_ids.max() < V
    assert len(np.unique(random_ids)) > 0.8 * V  # drawn from the whole vocabulary


def test_equal_seeds_equal_masks_other_seeds_other_masks():
    ids, mask, _, _ = make_batch(32, 24, seed=2)
    a, b, c = run_mask(ids, mask, seed=(3, 4)), run_mask(ids, mask, seed=(3, 4)), run_mask(
        ids, mask, seed=(3, 5))
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert (a["masked_lm_positions"] != c["masked_lm_positions"]).any(axis=1).mean() > 0.5


def test_whole_words_are_masked_together():
    ids, mask, _, _ = make_batch(128, 40, seed=3, pieces=0.5)
    p = 12
    out = run_mask(ids, mask, 0.3, p, whole_word=True)
    split_words = under_budget = 0
    for i in range(len(ids)):
        k = int(out["masked_lm_weights"][i].sum())
        chosen = set(out["masked_lm_positions"][i, :k].tolist())
        spans = reference_words(ids[i])
        budget = min(p, math.ceil(sum(e - s for s, e in spans) * 0.3 - 1e-9))
        assert k <= budget
        for start, end in spans:
            inside = {q for q in range(start, end) if q in chosen}
            assert inside in (set(), set(range(start, end))), (i, start, end, chosen)
        split_words += sum(1 for s, e in spans if e - s > 1 and s in chosen)
        # Google's rule: a word that would overflow the budget is skipped and later words
        # are still tried, so every word left out is larger than the room left at the end.
        left_out = [e - s for s, e in spans if s not in chosen]
        assert all(size > budget - k for size in left_out), (i, budget, k, left_out)
        under_budget += k < budget
        np.testing.assert_array_equal(out["masked_lm_ids"][i, :k],
                                      ids[i, sorted(chosen)])
        assert all(ids[i, q] not in SPECIAL for q in chosen)
    assert split_words > 50  # multi-piece words were chosen, all of their pieces with them
    assert under_budget > 0  # rows where no word fitted the last of the room
    # Without whole words, pieces of one word are chosen separately.
    pieces = run_mask(ids, mask, 0.3, p)
    partial = 0
    for i in range(len(ids)):
        k = int(pieces["masked_lm_weights"][i].sum())
        chosen = set(pieces["masked_lm_positions"][i, :k].tolist())
        partial += sum(1 for s, e in reference_words(ids[i])
                       if 0 < len(chosen & set(range(s, e))) < e - s)
    assert partial > 10


def write_unmasked(path, num, seq_length, seed):
    ids, mask, types, nsp = make_batch(num, seq_length, seed=seed)
    records = features.serialize_examples(ids, mask, types, None, None, None, nsp)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for r in records:
            writer.write(r)
    features.write_sidecar(str(path), {
        "max_seq_length": seq_length, "max_predictions_per_seq": None, "masking": "dynamic",
        "shard": {"index": 0, "num_shards": 1, "instances": num}})
    return ids


def _original(features_batch, labels):
    """Unmasked ids: the masked positions put back."""
    ids = features_batch["input_word_ids"].numpy().copy()
    pos = features_batch["masked_lm_positions"].numpy()
    w = labels["mlm_logits"].numpy()
    for i in range(len(ids)):
        k = int((pos[i] > 0).sum())
        ids[i, pos[i, :k]] = w[i, :k]
    return ids


def test_pipeline_masks_anew_each_pass_reproducibly_and_resumes_exactly(tmp_path):
    s, p, n, batch = 20, 5, 24, 8
    path = tmp_path / "dyn.tfrecord"
    originals = write_unmasked(path, n, s, seed=4)
    assert input_masking([str(path)]) == "dynamic"
    config = masking.DynamicMasking.from_vocab(VOCAB, 0.2, p)

    def stream(skip=0, seed=7):
        ds = pretraining_dataset(str(path), batch, s, p, seed=seed, masking=config,
                                 autotune=False, skip_batches=skip, shuffle_buffer_size=1)
        return list(ds.take(6 - skip))  # two passes of 3 batches

    first, again, other = stream(), stream(), stream(seed=8)
    resumed = stream(skip=4)
    by_row = {}
    for b, (x, y, w) in enumerate(first):
        assert x["masked_lm_positions"].shape == (batch, p)
        assert w["mlm_logits"].shape == (batch, p)
        for name in x:
            np.testing.assert_array_equal(x[name].numpy(), again[b][0][name].numpy())
        for row, original in zip(range(batch), _original(x, y)):
            match = np.flatnonzero((originals == original).all(axis=1))
            assert len(match) >= 1  # masks applied to the stored, unmasked rows
            by_row.setdefault(int(match[0]), []).append(
                tuple(x["masked_lm_positions"].numpy()[row]))
    for b in range(4, 6):
        for name in first[b][0]:
            np.testing.assert_array_equal(first[b][0][name].numpy(),
                                          resumed[b - 4][0][name].numpy())
    # Every row came twice (two passes) and was mostly masked differently the second time.
    assert all(len(v) == 2 for v in by_row.values()) and len(by_row) == n
    assert sum(a != b for a, b in by_row.values()) >= n * 0.6
    assert any((first[b][0]["masked_lm_positions"].numpy()
                != other[b][0]["masked_lm_positions"].numpy()).any() for b in range(6))


def test_pipeline_refuses_the_wrong_kind_of_data(tmp_path):
    path = tmp_path / "dyn.tfrecord"
    write_unmasked(path, 8, 16, seed=5)
    with pytest.raises(ValueError, match="no masks"):
        pretraining_dataset(str(path), 4, 16, 4, seed=1)
    from pretraining_data import write_dataset

    static = write_dataset(tmp_path, num_files=1, per_file=8, max_seq_length=16,
                           max_predictions_per_seq=4, vocab_size=V)
    config = masking.DynamicMasking.from_vocab(VOCAB, 0.15, 4)
    with pytest.raises(ValueError, match="already masked"):
        pretraining_dataset(static, 4, 16, 4, seed=1, masking=config)
    with pytest.raises(ValueError, match="mix statically masked data"):
        input_masking([str(path)] + features.expand_input_files(static))
