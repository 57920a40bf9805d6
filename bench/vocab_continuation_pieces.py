"""[UNK] rate and WordPieces per word on held-out text, for the two ways build_vocab can
give characters their "##" continuation piece (the A/B behind build_vocab's step 2):

  inside   only characters the corpus has inside words (Hugging Face's WordPieceTrainer
           alone; build_vocab before 2026-12-02)
  every    every character of a word of two or more characters (build_vocab now)

    python bench/vocab_continuation_pieces.py --train=ko/train.txt \
        --heldout=help:ko/heldout.txt,law:ko/law.txt,chat:ko/chat.txt \
        --vocab_sizes=4000,8000,12000 [--no-do_lower_case] [--strip_accents]

Each vocabulary is learnt in-process from the same word counts (build_vocab's normalizer
and trainer; the compact layout, 5 reserved tokens); held-out words are tokenized by
greedy longest match (WordPiece), a word with no match being one [UNK]. Prints a Markdown
table. BUILD_NOTES 4.2 has the figures and how the Korean files were made.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_prep import build_vocab, tokenization  # noqa: E402


def words_of(path: str, pretokenizer) -> list[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    out: list[str] = []
    for i in range(0, len(lines), 2000):
        for words in pretokenizer.split_words(lines[i:i + 2000]):
            out.extend(words)
    return out


def pieces(word: str, vocab: set[str]) -> int | None:
    """WordPieces of `word` by greedy longest match, or None when it is [UNK]."""
    if len(word) > 100:
        return None
    start, n = 0, 0
    while start < len(word):
        end = len(word)
        while end > start and (("##" if start else "") + word[start:end]) not in vocab:
            end -= 1
        if end == start:
            return None
        start, n = end, n + 1
    return n


def learn(counts: collections.Counter, size: int, variant: str) -> list[str]:
    if variant == "every":
        return build_vocab.train_wordpiece(counts, size)
    inside = sorted({ch for w in counts for ch in w[1:]})
    with mock.patch.object(build_vocab, "continuation_characters", lambda _: inside):
        return build_vocab.train_wordpiece(counts, size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", required=True)
    parser.add_argument("--heldout", required=True, help="name:path,...")
    parser.add_argument("--vocab_sizes", default="4000,8000,12000")
    parser.add_argument("--do_lower_case", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--strip_accents", action=argparse.BooleanOptionalAction, default=False)
    args = parser.parse_args()
    pre = tokenization.pretokenizer(args.do_lower_case, args.strip_accents, True)
    try:
        counts = collections.Counter(words_of(args.train, pre))
        items = [item.split(":", 1) for item in args.heldout.split(",")]
        if any(len(item) != 2 for item in items):
            parser.error(f"--heldout={args.heldout}: expected name:path,...")
        heldout = {name: words_of(path, pre) for name, path in items}
    except OSError as e:
        parser.error(f"{e.filename}: {e.strerror}")
    print(f"train: {args.train}, {sum(counts.values())} words ({len(counts)} distinct)")
    print("| vocab size | '##' pieces: | " + " | ".join(
        f"{name} ({len(words)} words): [UNK] % / pieces per word" for name, words in heldout.items())
        + " |")
    print("| ---: | --- |" + " ---: |" * len(heldout))
    for size in (int(s) for s in args.vocab_sizes.split(",")):
        for variant in ("inside", "every"):
            try:
                vocab = set(learn(counts, size - 5, variant))
            except build_vocab.BuildVocabError as e:  # e.g. a corpus too small for the size
                parser.error(f"--vocab_sizes: {size}: {e}")
            singles = sum(t.startswith("##") and len(t) == 3 for t in vocab)
            cells = []
            for words in heldout.values():
                n = [pieces(w, vocab) for w in words]
                unk = sum(p is None for p in n)
                total = sum(1 if p is None else p for p in n)
                cells.append(f"{100 * unk / len(words):.2f} / {total / len(words):.3f}")
            print(f"| {size} | {variant} ({singles} '##x') | " + " | ".join(cells) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
