r"""How far a bfloat16 classifier export is from the float32 one on a real fine-tuned model.

    python bench/finetune_demo.py prepare --work_dir=W
    python bench/finetune_demo.py run --work_dir=W --tasks=spam --inits=minilm
    python bench/serving_dtype_agreement.py --model_dir=W/runs/spam-minilm \
        --eval_file=W/data/spam/test.jsonl --max_seq_length=64

Exports `--model_dir` (run_classifier's --output_dir) twice with export_classifier, as
`--serving_dtype=float32` and `--serving_dtype=bfloat16`, runs every text of `--eval_file`
(JSON lines with "text" and "label", run_classifier's format) through both exports'
serving_default signature, and prints: the share of texts whose predicted label agrees,
each export's accuracy against the file's labels, and the largest and median absolute
difference of the probabilities (BUILD_NOTES.md 8.11).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def export(model_dir: str, export_dir: str, dtype: str, max_seq_length: int) -> str:
    """Path of a fresh classifier export of `model_dir` in `dtype` (export_classifier)."""
    subprocess.run([sys.executable, "-m", "export.export_classifier", f"--model_dir={model_dir}",
                    f"--export_dir={export_dir}", f"--max_seq_length={max_seq_length}",
                    f"--serving_dtype={dtype}", "--version=1"], check=True, cwd=REPO)
    return os.path.join(export_dir, "1")


def probabilities(path: str, texts: list[str], batch_size: int = 64) -> np.ndarray:
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops the export uses)

    serve = tf.saved_model.load(path).signatures["serving_default"]
    return np.concatenate([serve(text=tf.constant(texts[i:i + batch_size]))["probabilities"]
                           .numpy() for i in range(0, len(texts), batch_size)])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--eval_file", required=True)
    parser.add_argument("--max_seq_length", type=int, default=128)
    args = parser.parse_args()
    with open(os.path.join(args.model_dir, "labels.txt"), encoding="utf-8") as f:
        labels = f.read().split()
    with open(args.eval_file, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    unknown = sorted({str(r.get("label")) for r in rows} - set(labels))
    if not rows or unknown or any("text" not in r for r in rows):
        raise SystemExit(f"error: --eval_file={args.eval_file}: expected JSON lines with "
                         f"\"text\" and a \"label\" of {labels}"
                         + (f"; found labels {unknown}" if unknown else ""))
    texts = [r["text"] for r in rows]
    gold = np.array([labels.index(str(r["label"])) for r in rows])
    with tempfile.TemporaryDirectory() as work:
        probs = {dtype: probabilities(export(args.model_dir, os.path.join(work, dtype), dtype,
                                             args.max_seq_length), texts)
                 for dtype in ("float32", "bfloat16")}
    p32, p16 = probs["float32"], probs["bfloat16"]
    a32, a16 = p32.argmax(-1), p16.argmax(-1)
    print(json.dumps({
        "examples": len(texts), "labels": labels,
        "label_agreement": float((a32 == a16).mean()),
        "disagreements": int((a32 != a16).sum()),
        "accuracy_float32": float((a32 == gold).mean()),
        "accuracy_bfloat16": float((a16 == gold).mean()),
        "max_abs_probability_difference": float(np.abs(p32 - p16).max()),
        "median_abs_probability_difference": float(np.median(np.abs(p32 - p16).max(-1))),
    }, indent=1))


if __name__ == "__main__":
    main()
