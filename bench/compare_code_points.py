"""Every Unicode code point through our tokenizer and transformers' BertTokenizer.

    python bench/compare_code_points.py

For each setting, tokenizes "a" + chr(cp) + "b" for all 1,112,064 scalar values with the
bert-base-uncased vocabulary and counts the code points whose ids differ, by Unicode
category (Python's unicodedata), separating tokenizers' CJK range typo (U+2B820..U+2B91F).
Takes a few minutes (most of it in the reference).
"""

from __future__ import annotations

import collections
import sys
import unicodedata
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "tests")]

import tokenizer_refs as refs  # noqa: E402
from public_data import fetch  # noqa: E402
from data_prep.tokenization import BertTokenizer  # noqa: E402

SETTINGS = [  # do_lower_case, strip_accents, tokenize_chinese_chars
    (True, None, True), (False, None, True), (True, False, True), (True, None, False)]


def main() -> None:
    vocab = str(fetch.bert_base_uncased_vocab())
    cps = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    texts = ["a" + chr(cp) + "b" for cp in cps]
    print(f"Python unicodedata {unicodedata.unidata_version}; {len(cps)} code points\n")
    print("| do_lower_case | strip_accents | tokenize_chinese_chars | code points differing "
          "| of which CJK range typo | by category (others) |")
    print("| --- | --- | --- | ---: | ---: | --- |")
    for lower, strip, cjk in SETTINGS:
        ours = BertTokenizer(vocab, lower, strip, cjk).encode(texts)
        ref = refs.hf_encode(refs.hf_tokenizer(vocab, lower, strip, cjk), texts)
        diff = [cp for cp, a, b in zip(cps, ours, ref) if a != b]
        typo = [cp for cp in diff if 0x2B820 <= cp <= 0x2B91F]
        cats = collections.Counter(unicodedata.category(chr(cp)) for cp in diff if cp not in typo)
        print(f"| {lower} | {strip} | {cjk} | {len(diff)} | {len(typo)} | "
              f"{', '.join(f'{c} {n}' for c, n in cats.most_common())} |", flush=True)


if __name__ == "__main__":
    main()
