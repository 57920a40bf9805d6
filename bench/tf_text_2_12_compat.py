"""Proves the tokenizer's SavedModel runs on stock TF Serving's tensorflow-text (2.12.1).

Step 1, in the project venv (TF 2.21): export one tokenizer SavedModel per setting and the
ids our eager tokenizer gives on the test fixtures plus some ill-formed UTF-8:

    .venv/bin/python bench/tf_text_2_12_compat.py export /tmp/tok212

Step 2, in a separate venv with the serving versions (not a project dependency):

    python3.11 -m venv /tmp/tf212
    /tmp/tf212/bin/pip install "tensorflow==2.12.1" "tensorflow-text==2.12.1"
    /tmp/tf212/bin/python bench/tf_text_2_12_compat.py check /tmp/tok212

Step 2 imports only tensorflow and tensorflow_text (no project code) and prints, per
setting, how many of the texts get different ids (expected: 0).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SETTINGS = {
    "uncased": {},
    "cased": {"do_lower_case": False},
    "korean": {"strip_accents": False},
    "no_chinese_split": {"tokenize_chinese_chars": False},
}


def export(out_dir: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(root), str(root / "tests")]
    import tensorflow as tf

    import tokenizer_refs as refs
    from public_data import fetch
    from data_prep.tokenization import BertTokenizer

    lines = refs.read_lines(refs.MIXED_FILE) + refs.read_lines(refs.KOREAN_FILE)
    data = [s.encode("utf-8") for s in lines] + [
        b"caf\xc3 au \xff lait", b"\xed\xa0\x80x\xf0\x9f\x98", b"x" * 300 + b" y"]
    vocab = str(fetch.bert_base_uncased_vocab())
    expected = {}
    for name, kwargs in SETTINGS.items():
        tok = BertTokenizer(vocab, **kwargs)

        class Module(tf.Module):
            def __init__(self):
                super().__init__()
                self.tokenizer = tok

            @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
            def serve(self, text):
                ids = self.tokenizer(text)
                return {"values": ids.flat_values, "row_splits": ids.row_splits}

        module = Module()
        tf.saved_model.save(module, str(out_dir / name),
                            signatures={"serving_default": module.serve.get_concrete_function()})
        expected[name] = tok.encode(data)
    (out_dir / "expected.json").write_text(json.dumps({"texts": [d.hex() for d in data],
                                                       "ids": expected}))
    print(f"exported {len(SETTINGS)} SavedModels and {len(data)} texts to {out_dir}")


def check(out_dir: Path) -> int:
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers FastBertNormalize & co, as TF Serving does)

    print(f"tensorflow {tf.__version__}, tensorflow-text {tensorflow_text.__version__}")
    spec = json.loads((out_dir / "expected.json").read_text())
    texts = tf.constant([bytes.fromhex(h) for h in spec["texts"]])
    failures = 0
    for name, want in spec["ids"].items():
        fn = tf.saved_model.load(str(out_dir / name)).signatures["serving_default"]
        out = fn(text=texts)
        values, splits = out["values"].numpy().tolist(), out["row_splits"].numpy().tolist()
        got = [values[a:b] for a, b in zip(splits[:-1], splits[1:])]
        differ = sum(g != w for g, w in zip(got, want))
        failures += differ
        print(f"{name}: {len(want)} texts, {differ} differ")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("export", "check"):
        sys.exit(__doc__)
    directory = Path(sys.argv[2])
    if sys.argv[1] == "export":
        export(directory)
    else:
        sys.exit(check(directory))
