r"""What the demo's pretraining buys with few labels: pretrained encoder vs random init.

    python bench/demo_pretraining_value.py --workdir=out/quickstart --work_dir=/tmp/dpv \
        --labels=100,250 --seeds=1,2,3 [--learning_rate=5e-4] [--init_checkpoint=DIR]

Reads a finished quickstart workdir (`make demo`: pretrain/, vocab.txt, spam/). For each
number of labels N, the first N emails of spam/train.jsonl (shuffled once by the demo's
split, seed 12345) are the training set and spam/test.jsonl (1,000 emails) the test set;
run_classifier fine-tunes from the pretrained encoder (`--init_checkpoint`, default
<workdir>/pretrain) and from random initialisation of the same architecture, with the same
flags, for every seed. Every epoch count gives 125 updates at batch 16 (N=100: 20 epochs),
so each N trains as long. Prints mean and sample sd per starting point and the gain per
seed; every run is a printed command, its output under --work_dir (finished runs are
reused). BUILD_NOTES.md, issue 43, has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import zlib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, UPDATES = 16, 125


def run_classifier(args, train_file: str, init_flag: str, seed: int, output_dir: str) -> dict:
    results = os.path.join(output_dir, "eval_results.json")
    if not os.path.exists(results):
        epochs = UPDATES * BATCH / sum(1 for _ in open(train_file, encoding="utf-8"))
        cmd = [sys.executable, "-m", "bert_keras.run_classifier", "--do_train", "--do_eval",
               f"--train_file={train_file}",
               f"--eval_file={os.path.join(args.workdir, 'spam', 'test.jsonl')}", init_flag,
               f"--vocab_file={os.path.join(args.workdir, 'vocab.txt')}",
               f"--output_dir={output_dir}", "--max_seq_length=128",
               f"--train_batch_size={BATCH}", f"--learning_rate={args.learning_rate}",
               f"--num_train_epochs={epochs:g}", f"--seed={seed}", "--overwrite_output"]
        print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
        start = time.time()
        env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-3000:])
        print(f"  done in {time.time() - start:.0f} s", flush=True)
    with open(results, encoding="utf-8") as f:
        return json.load(f)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default=os.path.join(REPO, "out", "quickstart"),
                        help="a finished quickstart workdir")
    parser.add_argument("--work_dir", required=True, help="where the runs go")
    parser.add_argument("--labels", default="100,250", help="training set sizes")
    parser.add_argument("--seeds", default="1,2,3", help="run_classifier seeds")
    parser.add_argument("--learning_rate", type=float, default=5e-4)
    parser.add_argument("--init_checkpoint", help="the pretrained encoder (default: "
                        "<workdir>/pretrain)")
    args = parser.parse_args(argv)
    args.workdir = os.path.abspath(args.workdir)
    init = os.path.abspath(args.init_checkpoint or os.path.join(args.workdir, "pretrain"))
    starts = {"pretrained": f"--init_checkpoint={init}",
              "random": "--bert_config_file=" + os.path.join(args.workdir, "pretrain",
                                                             "bert_config.json")}
    seeds = [int(s) for s in args.seeds.split(",")]
    with open(os.path.join(args.workdir, "spam", "train.jsonl"), encoding="utf-8") as f:
        rows = f.read().splitlines()
    os.makedirs(args.work_dir, exist_ok=True)
    lines = []
    for n in (int(x) for x in args.labels.split(",")):
        train_file = os.path.join(args.work_dir, f"train_{n}.jsonl")
        with open(train_file, "w", encoding="utf-8") as f:
            f.write("\n".join(rows[:n]) + "\n")
        accuracy = {}
        for name, flag in starts.items():
            # Runs from another --init_checkpoint go to other directories.
            start = name if name == "random" else f"{name}_{zlib.crc32(init.encode()):08x}"
            accuracy[name] = [run_classifier(args, train_file, flag, seed, os.path.join(
                args.work_dir, f"n{n}_lr{args.learning_rate:g}_{start}_seed{seed}"))["accuracy"]
                for seed in seeds]
        gains = [100 * (p - r) for p, r in zip(accuracy["pretrained"], accuracy["random"])]
        spread = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0  # noqa: E731
        lines.append(
            f"| {n} | " + " | ".join(f"{100 * statistics.mean(accuracy[k]):.1f} +- "
                                     f"{100 * spread(accuracy[k]):.1f}" for k in starts)
            + f" | {statistics.mean(gains):+.1f} ({', '.join(f'{g:+.1f}' for g in gains)}) |")
    print(f"\nspam test accuracy (%), mean +- sd over seeds {args.seeds}, lr "
          f"{args.learning_rate:g}, {UPDATES} updates at batch {BATCH}; init {init}\n")
    print("| labels | pretrained | random init | gain, points (per seed) |")
    print("| ---: | ---: | ---: | --- |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
