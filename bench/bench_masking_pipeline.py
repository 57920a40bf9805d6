r"""What dynamic masking costs the input pipeline, against static masks at the same shapes.

    nice -n 19 python bench/bench_masking_pipeline.py --batches=200

Writes synthetic records (Google's shapes: S=128, P=20, a 30,522-entry vocabulary with
"##" pieces) once with masks and once without, then times `inputs.pretraining_dataset`
over each: static masks, dynamic masks, dynamic whole-word masks. The pipeline runs beside
the training step (prefetch), so what matters is its CPU time per batch against a training
step's (bench/bench_pretraining.py: about 750 ms at the mini preset, batch 32, 2 cores).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seq_length", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=20)
    args = parser.parse_args()

    import tensorflow as tf

    from bert_keras import masking
    from bert_keras.inputs import pretraining_dataset
    from data_prep import features

    vocab = (["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]",
                                                                  "[MASK]"]
             + [f"w{i}" for i in range(24000)] + [f"##p{i}" for i in range(6418)])
    cls, sep = vocab.index("[CLS]"), vocab.index("[SEP]")
    rng = np.random.default_rng(0)
    n, s, p = 4096, args.seq_length, args.predictions
    ids = rng.integers(104, len(vocab), (n, s)).astype(np.int32)
    lengths = rng.integers(s // 2, s + 1, n)
    mask = (np.arange(s)[None, :] < lengths[:, None]).astype(np.int32)
    ids[:, 0] = cls
    ids[np.arange(n), lengths // 2] = sep
    ids[np.arange(n), lengths - 1] = sep
    ids *= mask
    types = ((np.arange(s)[None, :] > (lengths // 2)[:, None]) & (mask > 0)).astype(np.int32)
    nsp = rng.integers(0, 2, n)
    positions = np.sort(rng.integers(1, 60, (n, p)), axis=1)
    labels = rng.integers(104, len(vocab), (n, p))
    weights = np.ones((n, p), np.float32)
    directory = tempfile.mkdtemp(prefix="bench_masking_")
    paths = {}
    for kind, masks in (("static", (positions, labels, weights)), ("dynamic", (None,) * 3)):
        path = os.path.join(directory, f"{kind}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for record in features.serialize_examples(ids, mask, types, *masks, nsp):
                writer.write(record)
        features.write_sidecar(path, {"max_seq_length": s,
                                      "max_predictions_per_seq": p if kind == "static" else None,
                                      "masking": kind})
        paths[kind] = path

    rows = [("static masks (from the file)", paths["static"], None),
            ("dynamic masks", paths["dynamic"],
             masking.DynamicMasking.from_vocab(vocab, 0.15, p)),
            ("dynamic whole-word masks", paths["dynamic"],
             masking.DynamicMasking.from_vocab(vocab, 0.15, p, whole_word=True))]
    print(f"batch {args.batch_size}, S={s}, P={p}, V={len(vocab)}; {args.batches} batches "
          "after 10 of warm-up; 2 parallel calls, autotune off")
    for name, path, config in rows:
        dataset = pretraining_dataset(path, args.batch_size, s, p, seed=1, masking=config,
                                      autotune=False)
        iterator = iter(dataset)
        for _ in range(10):
            next(iterator)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.batches):
            next(iterator)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(f"{name:32s} {1000 * wall / args.batches:7.2f} ms/batch wall, "
              f"{1000 * cpu / args.batches:7.2f} ms/batch CPU")


if __name__ == "__main__":
    main()
