r"""Builds a large Google-format corpus of distinct documents from public text (issue 25).

Sources (fetched and cached by public_data): the 233 State of the Union addresses (split into
sentences by data_prep.prepare_corpus) and the 500 Brown corpus files (already one sentence
per item). Each output document is a run of 8-60 consecutive sentences starting at a random
sentence of a random source document, so documents are distinct (different spans) while
every sentence is real text. Seeded: the same size and seed give the same file.

  python bench/beam_scale_corpus.py --output=/tmp/i25scale/corpus.txt --mb=100
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from public_data import datasets, fetch  # noqa: E402  pylint: disable=wrong-import-position


def source_documents() -> list[list[str]]:
    docs = []
    with tempfile.TemporaryDirectory() as tmp:
        sotu = os.path.join(tmp, "sotu.txt")
        subprocess.run([sys.executable, "-m", "data_prep.prepare_corpus",
                        f"--input={fetch.fetch_sotu()}/*.txt", f"--output_file={sotu}"],
                       check=True, cwd=ROOT)
        with open(sotu, encoding="utf-8") as f:
            docs += [d.strip("\n").split("\n") for d in f.read().split("\n\n") if d.strip()]
    for sentences in datasets.brown_documents().values():
        docs.append([" ".join(s.words) for s in sentences])
    return docs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--output", required=True)
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    docs = source_documents()
    rng = random.Random(args.seed)
    size, count = 0, 0
    tmp = args.output + ".incomplete"
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as f:
        while size < args.mb * 1e6:
            doc = docs[rng.randrange(len(docs))]
            start = rng.randrange(len(doc))
            block = "\n".join(doc[start:start + rng.randint(8, 60)]) + "\n\n"
            f.write(block)
            size += len(block.encode("utf-8"))
            count += 1
    os.replace(tmp, args.output)
    print(f"{args.output}: {count} documents, {size / 1e6:.1f} MB from {len(docs)} sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
