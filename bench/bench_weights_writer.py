r"""The weights writer's A/B: `checkpoints.save_weights` against Keras' `model.save_weights`.

    .venv/bin/python bench/bench_weights_writer.py --preset=base --rounds=7

run_pretraining's checkpoints and resumption backups, and every `.weights.h5` the tools
write, go through `bert_keras.checkpoints.save_weights`: Keras' own H5IOStore and state
walk writing through a file object that drops writes after the first failure, so that a
full disk is an OSError naming the output instead of h5py's "Exception ignored" tracebacks
and a segmentation fault (BUILD_NOTES section 3). It replaces Keras' `save_weights` for
that failure alone; this script checks that it costs nothing when nothing fails.

It builds `BertPretrainer` at --preset with its AdamW slots (what a backup holds: weights,
two moments and the iteration counter), then, in --rounds interleaved rounds (the order
alternating), writes the file both ways into --dir and times each write (the file closed,
not synced: neither writer syncs). Before timing it checks that both files hold the same
datasets with equal values. Prints one JSON line per round and a summary: the median of
each side, and the median of the per-round ratios keras / ours (above 1, ours is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402


def datasets(path: str) -> dict:
    """Every dataset of an HDF5 file: {name: numpy array}."""
    import h5py

    found = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: found.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    return found


def build(preset: str):
    """BertPretrainer at `preset`, compiled with AdamW and its slots built."""
    from bert_keras import BertConfig, BertPretrainer
    from bert_keras.optimization import AdamW

    model = BertPretrainer.from_bert_config(BertConfig.from_preset(preset))
    model.compile(optimizer=AdamW(learning_rate=1e-4, weight_decay=0.01))
    model.optimizer.build(model.trainable_variables)
    return model


def timed_write(write, path: str) -> float:
    if os.path.exists(path):
        os.remove(path)
    start = time.perf_counter()
    write(path)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="base",
                        help="BertConfig preset (tiny, mini, ..., base, large)")
    parser.add_argument("--rounds", type=int, default=7,
                        help="interleaved rounds of one write each way")
    parser.add_argument("--dir", default=None,
                        help="where the files are written (default: a temporary directory)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds: expected a positive number")
    if args.dir is not None and not os.path.isdir(args.dir):
        # Checked before the model is built: tempfile would fail later with a traceback.
        parser.error(f"--dir={args.dir}: not an existing directory")

    from bert_keras import checkpoints

    model = build(args.preset)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        ours_path = os.path.join(tmp, "ours.weights.h5")
        keras_path = os.path.join(tmp, "keras.weights.h5")
        sides = {"ours": lambda p: checkpoints.save_weights(model, p),
                 "keras": model.save_weights}
        paths = {"ours": ours_path, "keras": keras_path}

        # Equivalence first, on the warm-up writes.
        for name in ("ours", "keras"):
            timed_write(sides[name], paths[name])
        a, b = datasets(ours_path), datasets(keras_path)
        if sorted(a) != sorted(b):
            raise SystemExit(f"error: the files differ in datasets: {sorted(set(a) ^ set(b))[:5]}")
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        size_mb = os.path.getsize(ours_path) / 1e6
        print(json.dumps({"preset": args.preset, "datasets": len(a), "file_mb": round(size_mb, 1),
                          "equal": True}))

        times = {"ours": [], "keras": []}
        for r in range(args.rounds):
            order = ("ours", "keras") if r % 2 == 0 else ("keras", "ours")
            for name in order:
                times[name].append(timed_write(sides[name], paths[name]))
            print(json.dumps({"round": r, **{k: round(v[-1], 3) for k, v in times.items()}}))

    ratios = [k / o for k, o in zip(times["keras"], times["ours"])]
    print(json.dumps({
        "ours_s_median": round(float(np.median(times["ours"])), 3),
        "keras_s_median": round(float(np.median(times["keras"])), 3),
        "ratio_keras_over_ours_median": round(float(np.median(ratios)), 3),
        "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3)}))


if __name__ == "__main__":
    main()
