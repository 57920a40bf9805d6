"""Compares WordPiece vocabulary trainers on a few MB of State of the Union text.

    python bench/bench_vocab_trainers.py [--megabytes 4] [--vocab_size 8000]

Trainers (each in its own process, one thread, so peak memory is per trainer):
  tf_text     tensorflow-text's bert_vocab_from_dataset (Python learner, binary search
              on a frequency threshold)
  keras_hub   keras-hub's compute_word_piece_vocabulary (wraps the same learner)
  hf          Hugging Face tokenizers' WordPieceTrainer with its BERT normalizer
  build_vocab ours: the tokenizer's in-graph normalizer for words, then the HF trainer

Training text: the earliest addresses up to --megabytes; held-out text: 2001-2021. Prints
wall time, peak RSS, vocabulary size and wordpieces per word on the held-out text (with our
tokenizer, uncased), as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESERVED = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _one_thread() -> None:
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)


def train(name: str, files: list[str], vocab_size: int) -> list[str]:
    """Runs one trainer; returns the vocabulary (list of tokens)."""
    if name == "tf_text":
        import tensorflow as tf
        from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset as bv

        ds = tf.data.TextLineDataset(files).batch(1024)
        return bv.bert_vocab_from_dataset(ds, vocab_size, RESERVED,
                                          bert_tokenizer_params=dict(lower_case=True))
    if name == "keras_hub":
        import keras_hub

        return keras_hub.tokenizers.compute_word_piece_vocabulary(
            files, vocab_size, lowercase=True, strip_accents=True, reserved_tokens=RESERVED)
    if name == "hf":
        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=RESERVED,
                                            min_frequency=2, show_progress=False)
        tok.train(files, trainer)
        vocab = tok.get_vocab()
        return sorted(vocab, key=vocab.__getitem__)
    if name == "build_vocab":
        from data_prep import build_vocab

        return build_vocab.build_vocab(files, vocab_size, layout="compact", min_frequency=2)
    raise ValueError(name)


def child(name: str, files: list[str], vocab_size: int, out: str) -> None:
    _one_thread()
    start = time.perf_counter()
    vocab = train(name, files, vocab_size)
    seconds = time.perf_counter() - start
    with open(out, "w", encoding="utf-8") as f:
        f.write("".join(t + "\n" for t in vocab))
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "rss_mb": rss_mb}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megabytes", type=float, default=4.0)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--trainers", default="tf_text,keras_hub,hf,build_vocab")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, files, out = args.child
        child(name, files.split(","), args.vocab_size, out)
        return

    from public_data import fetch

    all_files = fetch.sotu_files()
    train_files, size = [], 0
    for f in all_files:
        if size >= args.megabytes * 1e6:
            break
        train_files.append(str(f))
        size += f.stat().st_size
    held_out = [f for f in all_files if f.name[:4] >= "2001"]
    print(f"training text: {len(train_files)} addresses, {size / 1e6:.2f} MB; "
          f"held out: {len(held_out)} addresses; vocab_size={args.vocab_size}\n")

    from data_prep.tokenization import BertTokenizer

    held_text = [line for f in held_out for line in f.read_text(encoding="utf-8").splitlines() if line]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.trainers.split(","):
            out = os.path.join(tmp, f"{name}.txt")
            proc = subprocess.run(
                [sys.executable, __file__, "--vocab_size", str(args.vocab_size),
                 "--child", name, ",".join(train_files), out],
                capture_output=True, text=True, cwd=ROOT)
            if proc.returncode != 0:
                print(f"{name} failed:\n{proc.stderr[-2000:]}")
                continue
            stats = json.loads(proc.stdout.strip().splitlines()[-1])
            tok = BertTokenizer(out)
            words = sum(len(w) for w in tok.split_words(held_text))
            pieces = tok.encode(held_text)
            n_pieces = sum(len(p) for p in pieces)
            unk = sum(p.count(tok.unk_id) for p in pieces)
            rows.append((name, stats["seconds"], stats["rss_mb"], tok.vocab_size, n_pieces / words, unk))
    print("| trainer | seconds | peak RSS (MB) | vocab size | wordpieces/word (held out) | [UNK] |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, sec, rss, size_, fert, unk in rows:
        print(f"| {name} | {sec:.1f} | {rss:.0f} | {size_} | {fert:.3f} | {unk} |")


if __name__ == "__main__":
    main()
