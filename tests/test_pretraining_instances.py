"""data_prep.pretraining_instances: Google's algorithm on token ids, checked by invariants
and by statistics on generated corpora (bounds from the binomial standard deviation)."""

import collections
import math
import random

import numpy as np
import pytest

from data_prep import pretraining_instances as pi

CLS, SEP, MASK = 101, 102, 103
VOCAB = 40_000
# Document d's token at flat position k is BASE + 100 * d + k % 100: the id names its
# document, and consecutive tokens of a document differ by 1 (mod 100), so any contiguous
# run can be recognised after unmasking.
BASE = 1000


def special(continuation=None):
    return pi.SpecialTokens(cls_id=CLS, sep_id=SEP, mask_id=MASK, vocab_size=VOCAB,
                            is_continuation=continuation)


def make_doc(doc_id, sentence_lengths):
    total = sum(sentence_lengths)
    tokens = BASE + 100 * doc_id + np.arange(total) % 100
    splits = np.concatenate([[0], np.cumsum(sentence_lengths)]).tolist()
    return pi.Document(doc_id, tokens.astype(np.int32), splits)


def make_corpus(num_docs, seed, min_len=3, max_len=12, min_sent=8, max_sent=60):
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(num_docs):
        num_sentences = rng.integers(min_sent, max_sent + 1)
        docs.append(make_doc(d, rng.integers(min_len, max_len + 1, num_sentences).tolist()))
    return docs


def doc_of(token):
    return (int(token) - BASE) // 100


def collect(docs, config, sp=None, seed=1):
    stats = pi.InstanceStats()
    batches = list(pi.generate_instances(docs, config, sp or special(), random.Random(seed), stats))
    merged = {f: np.concatenate([getattr(b, f) for b in batches]) for f in pi.InstanceBatch._fields}
    return merged, stats


def unmask(out):
    """Original token ids: masked input with the labels put back."""
    ids = out["input_ids"].copy()
    for i in range(len(ids)):
        n = int(out["masked_lm_weights"][i].sum())
        ids[i, out["masked_lm_positions"][i, :n]] = out["masked_lm_ids"][i, :n]
    return ids


def within_binomial(count, n, p, sds=4.0):
    """|count/n - p| within `sds` binomial standard deviations."""
    sd = math.sqrt(p * (1 - p) / n)
    return abs(count / n - p) <= sds * sd, (count / n, p, sd)


# --- truncate_seq_pairs ---


def googles_truncation(len_a, len_b, max_num_tokens):
    """Google's loop, counting which side loses each token."""
    cut_a = cut_b = 0
    while len_a + len_b > max_num_tokens:
        if len_a > len_b:
            len_a, cut_a = len_a - 1, cut_a + 1
        else:
            len_b, cut_b = len_b - 1, cut_b + 1
    return cut_a, cut_b


def test_truncation_cuts_the_sides_google_does():
    la, lb = np.meshgrid(np.arange(1, 41), np.arange(1, 41))
    la, lb = la.ravel(), lb.ravel()
    np_rng = np.random.default_rng(0)
    for max_num_tokens in (2, 5, 17, 30, 79):
        af, ab, bf, bb = pi.truncate_seq_pairs(la, lb, max_num_tokens, np_rng)
        for i in range(len(la)):
            want = googles_truncation(la[i], lb[i], max_num_tokens)
            assert (af[i] + ab[i], bf[i] + bb[i]) == want
        assert (la - af - ab >= 1).all() and (lb - bf - bb >= 1).all()
        assert (la - af - ab + lb - bf - bb <= max_num_tokens).all()


def test_truncation_front_or_back_is_a_fair_coin():
    n = 20_000
    af, ab, bf, bb = pi.truncate_seq_pairs(np.full(n, 300), np.full(n, 10), 125,
                                           np.random.default_rng(1))
    assert (af + ab == 185).all() and (bf + bb == 0).all()
    ok, info = within_binomial(int(af.sum()), 185 * n, 0.5)
    assert ok, info
    # A 1 MB sentence costs nothing special.
    af, ab, _, _ = pi.truncate_seq_pairs(np.array([1_000_000]), np.array([3]), 125,
                                         np.random.default_rng(2))
    assert af[0] + ab[0] == 1_000_000 - 122


# --- the pool ---


def test_pool_excludes_the_current_document_and_is_bounded():
    rng = random.Random(0)
    pool = pi.OtherDocumentPool(capacity=3, window_tokens=20)
    with pytest.raises(ValueError, match="at least 2 documents"):
        pool.sample(0, rng)
    pool.add(make_doc(0, [5, 5, 5, 5, 5, 5]), rng)  # 30 tokens -> a window of <= 20
    with pytest.raises(ValueError, match="at least 2 documents"):
        pool.sample(0, rng)
    assert pool.sample(7, rng).doc_id == 0
    for d in (1, 2, 3):
        pool.add(make_doc(d, [4, 4]), rng)
    assert len(pool) == 3  # the oldest (document 0) was evicted
    seen = {pool.sample(2, rng).doc_id for _ in range(200)}
    assert seen == {1, 3}


def test_pool_windows_are_whole_sentences_from_a_random_one_until_any_b_is_complete():
    """A long document is kept as 4 windows of window_tokens / 4 = 3 tokens' worth: each the
    whole sentences from a drawn one until 3 tokens or the document's end (the sentence that
    crosses cut where the window reaches 6), so a B starting at its first sentence ends where Google's would."""
    rng = random.Random(3)
    full = [7, 3, 2, 1, 8, 6, 5]
    doc = make_doc(4, full)
    starts = collections.Counter()
    for _ in range(200):
        pool = pi.OtherDocumentPool(capacity=2, window_tokens=12)
        pool.add(doc, rng)
        entry = pool.sample(99, rng)
        assert len(entry.windows) == 4 and entry.windows[0] == 0
        assert not np.shares_memory(entry.tokens, doc.tokens)  # a copy: no big buffer kept
        bounds = list(entry.windows) + [entry.num_sentences]
        for lo, hi in zip(bounds, bounds[1:]):
            tokens = entry.tokens[entry.splits[lo]:entry.splits[hi]].astype(np.int64)
            assert (np.diff(tokens) % 100 == 1).all()  # one contiguous run of the document
            first = int(tokens[0] - BASE - 400)  # the document's token offset it starts at
            sentence = np.cumsum([0] + full).tolist().index(first)  # a sentence start
            starts[sentence] += 1
            lengths = np.diff(entry.splits[lo:hi + 1]).tolist()
            whole = full[sentence:sentence + len(lengths)]
            assert lengths[:-1] == whole[:-1] and sum(lengths) == min(sum(whole), 6)
            # ...until 3 tokens are reached (or the document ends), not beyond.
            assert sum(whole[:-1]) < 3 <= sum(whole) or sentence + len(lengths) == len(full)
    # The first sentences are uniform over the document's 7, as Google's B start is.
    assert set(starts) == set(range(7))
    ok, info = within_binomial(starts[0], sum(starts.values()), 1 / 7)
    assert ok, info
    # A short document is kept whole.
    pool = pi.OtherDocumentPool(capacity=2, window_tokens=40)
    pool.add(doc, rng)
    assert pool.sample(99, rng) is doc


def test_notnext_segments_are_as_long_as_googles():
    """Pooled documents were random windows of 4 * S tokens with B starting anywhere in
    them: Bs cut short at the window's end left NotNext rows short (padded) 4 times as often
    as Google's draw over whole documents (21% against 5% here), so a row's length told its
    NSP label. The same corpus with the pool keeping every document whole is Google's law."""
    docs = make_corpus(200, seed=7, min_len=3, max_len=12, min_sent=40, max_sent=120)
    shares = []
    for window in (None, 10**7):  # the default (4 * S), and whole documents
        config = pi.InstanceConfig(max_seq_length=64, max_predictions_per_seq=10,
                                   short_seq_prob=0.0, dupe_factor=2, pool_window_tokens=window)
        out, _ = collect(docs, config, seed=3)
        not_next = out["next_sentence_labels"] == 1
        short = out["input_mask"].sum(axis=1) < 64
        shares.append((int(short[not_next].sum()), int(not_next.sum())))
    (k, n), (k_google, n_google) = shares
    p = (k + k_google) / (n + n_google)
    sd = (p * (1 - p) * (1 / n + 1 / n_google)) ** 0.5
    assert abs(k / n - k_google / n_google) < 4 * sd, shares
    assert k_google / n_google < 0.08 and n > 2000, shares


# --- pairs and masking ---


def test_pairs_follow_googles_rules():
    rng = random.Random(5)
    docs = make_corpus(6, seed=5)
    pool = pi.OtherDocumentPool(10, 512)
    for d in docs:
        pool.add(d, rng)
    for doc in docs:
        pairs = pi.create_pairs_from_document(doc, pool, 64, 0.1, rng)
        assert pairs
        for p in pairs:
            assert p.a_tokens is doc.tokens and p.a_lo in doc.splits and p.a_hi in doc.splits
            assert p.a_hi > p.a_lo and p.b_hi > p.b_lo
            if p.is_random_next:
                assert p.b_doc_id != doc.doc_id
                assert {doc_of(t) for t in p.b_tokens[p.b_lo:p.b_hi]} == {p.b_doc_id}
            else:
                assert p.b_tokens is doc.tokens and p.b_lo == p.a_hi and p.b_hi in doc.splits
    # A one-sentence chunk can only be NotNext.
    lone = make_doc(9, [200])
    pairs = pi.create_pairs_from_document(lone, pool, 64, 0.0, rng)
    assert [p.is_random_next for p in pairs] == [True]


def test_masking_invariants_and_budget():
    docs = make_corpus(40, seed=11)
    config = pi.InstanceConfig(max_seq_length=64, max_predictions_per_seq=7, dupe_factor=2,
                               batch_size=97)
    out, stats = collect(docs, config)
    n, s = out["input_ids"].shape
    assert s == 64 and out["masked_lm_positions"].shape == (n, 7)
    original = unmask(out)
    for i in range(n):
        length = int(out["input_mask"][i].sum())
        assert out["input_mask"][i, :length].all() and not out["input_mask"][i, length:].any()
        assert not out["input_ids"][i, length:].any()
        seps = np.flatnonzero(original[i, :length] == SEP).tolist()
        assert original[i, 0] == CLS and len(seps) == 2 and seps[1] == length - 1
        len_a = seps[0] - 1
        assert (out["segment_ids"][i, :len_a + 2] == 0).all()
        assert (out["segment_ids"][i, len_a + 2:length] == 1).all()
        assert not out["segment_ids"][i, length:].any()
        k = int(out["masked_lm_weights"][i].sum())
        assert k == min(7, max(1, round(length * 0.15)))
        pos = out["masked_lm_positions"][i]
        assert (np.diff(pos[:k]) > 0).all()  # ascending and unique
        assert not pos[k:].any() and not out["masked_lm_ids"][i, k:].any()
        assert not out["masked_lm_weights"][i, k:].any()
        assert all(0 < q < length - 1 and q != seps[0] for q in pos[:k])  # never on specials/pad
        # The original is recoverable: A and B are contiguous runs of their documents.
        a, b = original[i, 1:seps[0]], original[i, seps[0] + 1:length - 1]
        for segment, doc_id in ((a, out["a_doc_ids"][i]), (b, out["b_doc_ids"][i])):
            assert {doc_of(t) for t in segment} == {doc_id}
            assert (np.diff(segment.astype(np.int64)) % 100 == 1).all()
    assert stats.instances == n and stats.masked == int(out["masked_lm_weights"].sum())


def test_statistics_on_a_generated_corpus():
    # Short sentences and no short targets: almost every chunk has several sentences, so the
    # NotNext share measures the 50% coin (a one-sentence chunk is always NotNext).
    docs = make_corpus(500, seed=21, min_len=4, max_len=14, min_sent=60, max_sent=120)
    config = pi.InstanceConfig(max_seq_length=128, max_predictions_per_seq=20, short_seq_prob=0.0,
                               dupe_factor=2)
    out, stats = collect(docs, config, seed=2)
    n = len(out["input_ids"])
    assert n >= 5000, n
    # NotNext: 50% +/- 2 and within 4 binomial SDs; each NotNext B from another document.
    not_next = out["next_sentence_labels"] == 1
    ok, info = within_binomial(int(not_next.sum()), n, 0.5)
    assert ok and abs(info[0] - 0.5) <= 0.02, info
    assert (out["b_doc_ids"][not_next] != out["a_doc_ids"][not_next]).all()
    assert (out["b_doc_ids"][~not_next] == out["a_doc_ids"][~not_next]).all()
    # Masked share of non-special tokens: 15% +/- 0.5 (the budget rounds len * 0.15, len
    # counting [CLS] and two [SEP], so the expected share is a little above 15%).
    real = int(out["input_mask"].sum()) - 3 * n
    masked = int(out["masked_lm_weights"].sum())
    assert abs(masked / real - 0.15) <= 0.005, masked / real
    # Among masked tokens: [MASK] 80%, unchanged 10%, random 10% (each +/- 2, and within 4 SD).
    original = unmask(out)
    rows, cols = np.nonzero(out["masked_lm_weights"])
    shown = out["input_ids"][rows, out["masked_lm_positions"][rows, cols]]
    truth = original[rows, out["masked_lm_positions"][rows, cols]]
    as_mask = int((shown == MASK).sum())
    unchanged = int((shown == truth).sum())
    replaced = masked - as_mask - unchanged
    for count, p in ((as_mask, 0.8), (unchanged, 0.1), (replaced, 0.1)):
        ok, info = within_binomial(count, masked, p)
        assert ok and abs(info[0] - p) <= 0.02, (count, info)
    # Random replacements cover the whole vocabulary (specials included, any entry).
    random_ids = shown[(shown != MASK) & (shown != truth)]
    assert random_ids.min() < 2000 and random_ids.max() > 30_000


def test_whole_word_masking_never_splits_a_word():
    continuation = np.zeros(VOCAB, bool)
    continuation[BASE:] = (np.arange(VOCAB - BASE) % 3) != 0  # ids = 0 mod 3 start words
    sp = special(continuation)
    docs = make_corpus(60, seed=31)
    config = pi.InstanceConfig(max_seq_length=48, max_predictions_per_seq=9, dupe_factor=2,
                               do_whole_word_mask=True)
    out, _ = collect(docs, config, sp=sp)
    original = unmask(out)
    full = 0
    for i in range(len(out["input_ids"])):
        length = int(out["input_mask"][i].sum())
        k = int(out["masked_lm_weights"][i].sum())
        budget = min(9, max(1, round(length * 0.15)))
        assert 0 <= k <= budget
        full += k == budget
        masked = np.zeros(length, bool)
        masked[out["masked_lm_positions"][i, :k]] = True
        # Words: a non-"##" token, or the first token after a special, plus following "##".
        word = -1
        words = np.full(length, -1)
        for j in range(1, length - 1):
            t = original[i, j]
            if t == SEP:
                word += 1
                continue
            if not continuation[t] or original[i, j - 1] in (CLS, SEP):
                word += 1
            words[j] = word
        for w in set(words[words >= 0].tolist()):
            states = set(masked[words == w].tolist())
            assert len(states) == 1, (i, w)  # all or nothing
            if not states.pop():  # greedy: an unmasked word did not fit in what was left
                assert (words == w).sum() > budget - k, (i, w)
    # The budget is normally filled (0.79 to 0.82 of the rows, by the seed, on this corpus).
    assert full > 0.75 * len(out["input_ids"])


def test_deterministic_for_a_seed():
    docs = make_corpus(30, seed=41)
    config = pi.InstanceConfig(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2,
                               batch_size=50)
    a, _ = collect(docs, config, seed=7)
    b, _ = collect(docs, config, seed=7)
    c, _ = collect(docs, config, seed=8)
    for f in a:
        np.testing.assert_array_equal(a[f], b[f])
    assert not np.array_equal(a["input_ids"], c["input_ids"])


def test_too_few_documents_is_an_error():
    config = pi.InstanceConfig()
    with pytest.raises(ValueError, match="single document"):
        list(pi.generate_instances([make_doc(0, [5] * 50)], config, special(), random.Random(0)))
    with pytest.raises(ValueError, match="no document"):
        list(pi.generate_instances([], config, special(), random.Random(0)))


def test_documents_stream_through_in_bounded_memory():
    consumed = []

    def stream():
        for d in range(5_000):
            consumed.append(d)
            yield make_doc(d, [6, 6, 6, 6])

    config = pi.InstanceConfig(max_seq_length=16, max_predictions_per_seq=3, dupe_factor=1,
                               pool_size=50, batch_size=64)
    it = pi.generate_instances(stream(), config, special(), random.Random(0))
    next(it)
    assert len(consumed) <= 60  # the pool filled, then instances flowed: no read-ahead
    rest = sum(len(b.input_ids) for b in it)
    assert len(consumed) == 5_000 and rest > 0


def test_config_checks_name_the_values():
    with pytest.raises(ValueError, match="max_predictions_per_seq=200, max_seq_length=128"):
        pi.InstanceConfig(max_predictions_per_seq=200)
    with pytest.raises(ValueError, match="masked_lm_prob"):
        pi.InstanceConfig(masked_lm_prob=0.0)
    with pytest.raises(ValueError, match="max_seq_length must be >= 5"):
        pi.InstanceConfig(max_seq_length=4, max_predictions_per_seq=1)
