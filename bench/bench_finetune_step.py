r"""The fine-tuning training step alone, side by side: bert-keras against Hugging Face
transformers (torch), on the same MiniLM-L6 token tagger and the same random batches.
Step time and memory, by batch size.

    python bench/bench_finetune_step.py --work_dir=/tmp/step   # B32 x S64, ours vs transformers
    python bench/bench_finetune_step.py --work_dir=/tmp/step \
        --sides=ours,ours_no_onednn,transformers   # the oneDNN A/B
    python bench/bench_finetune_step.py --work_dir=/tmp/mem --batch_sizes=8,16,32,48 \
        --steps=12 --rounds=1   # memory by batch size (per example, and at B = 0)
    python bench/bench_finetune_step.py --work_dir=/tmp/smoke --init=tiny --steps=6 \
        --warmup_steps=2 --rounds=1   # smoke test

These give BUILD_NOTES.md section 8.5 ("On an AVX2-only CPU") a command for its step-time
table (oneDNN on and off against transformers, MiniLM tagger at B32 x S64) and for its
memory by batch size (anonymous MB per example and the fixed excess at B = 0), which came
from throwaway scripts. bench/bench_finetune_vs_transformers.py is the end-to-end
benchmark (real data, accuracy, the tools as a user runs them); this one times the step.

Model (--init, as in bench_finetune_vs_transformers.py): `minilm`, the real MiniLM-L6
weights (`python -m public_data.fetch minilm`); `tiny`, a randomly initialised 2-layer
BertModel beside MiniLM's vocabulary (smoke tests). On it, a token tagger of --num_tags tags
(190, Brown POS's), dropout 0.1.

Data: --batch_sizes[i] x --steps random examples of --seq_length tokens (numpy
default_rng(--seed), the same arrays on every side): word ids in [1000, 30000) over a real
length uniform in [S/3, S], padding after it; type ids 0; a random tag on every real token
(the loss ignores padding: label -1 for us, -100 for torch).

Sides (--sides), each run its own process, one at a time, the order of sides alternating
from one (round, batch size) to the next; TensorFlow's and torch's threads at their
defaults:
  ours            `BertTagger` on `model_loading.load_checkpoint(init, want="encoder")`,
                  trained by `finetuning.loop.train` (Keras fit, AdamW, warmup + linear
                  decay) for --steps updates; the process starts with TF_ENABLE_ONEDNN_OPTS
                  unset, so bert_keras's default decides (oneDNN on, on x86-64)
  ours_no_onednn  the same with TF_ENABLE_ONEDNN_OPTS=0 (TensorFlow's Eigen kernels)
  ours_padded     the same with `BertTagger(skip_padding=False)`: every padded position
                  computed, as transformers does (ours trains padding-free by default)
  ours_keras_adamw  the same model compiled with Keras' own `keras.optimizers.AdamW` (same
                  schedule, decay, epsilon and global_clipnorm, no decay exclusions) and
                  trained by `model.fit`: what a user's own Keras script runs
  transformers    BertForTokenClassification.from_pretrained(init, num_labels=num_tags),
                  transformers' example loop: torch AdamW (no decay on biases and
                  LayerNorm weights), get_linear_schedule_with_warmup, clip_grad_norm_ 1.0
Both: peak learning rate 5e-5, warmup 10% of the steps, weight decay 0.01, Adam epsilon 1e-6.

Step time: time.perf_counter() at the end of each update (a Keras callback's
on_train_batch_end; after optimizer.zero_grad() for torch); the median, and the mean, of the
updates after the first --warmup_steps (tracing, allocator warm-up). Ours times
`loop.train` as a user gets it, its progress log included (every 50 steps and at the last,
before this callback): the last step measures longer, which moves the mean, not the median.
Memory per run: peak RSS (the worker's VmHWM, and ru_maxrss from the parent's os.wait4),
peak anonymous RSS (RSS less file-backed library pages, sampled every 20 ms), and RSS after
imports, model load, the warm-up steps and training. With two or more batch sizes, a
least-squares line per side of peak anonymous RSS, and of peak RSS, against batch size: its
slope (MB per example) and its value at B = 0 (the fixed cost; batch 0 itself cannot run).

Run it on a quiet machine. torch's OpenMP threads wait on each other at every operation:
with another process on one of two cores, the tiny smoke model's torch step took about
1 s at 2 threads against 25 ms at 1 (OMP_NUM_THREADS=1), while ours stayed at 25 ms.
results.json records the load average before the first run.

Writes <work_dir>/results.json (every run, per-step times included) and results.md (the
tables, also printed).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.bench_finetune_vs_transformers import (  # noqa: E402
    ADAM_EPSILON,
    CLIP_NORM,
    TINY,
    WEIGHT_DECAY,
    Stages,
    prepare_init,
    rss_mb,
    torch_optimizer,
    torch_step,
)

SIDES = ("ours", "ours_no_onednn", "ours_padded", "ours_keras_adamw", "transformers")
DEFAULT_SIDES = ("ours", "transformers")
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"  # data_prep.tf_logging.ONEDNN_ENV (not imported here:
# the parent stays free of TensorFlow)
LEARNING_RATE, WARMUP_PROPORTION = 5e-5, 0.1
ID_RANGE = (1000, 30000)  # word ids drawn from [low, high): real wordpieces of MiniLM's vocabulary


# ------------------------------------------------------------------------------------------
# Data (each worker; the same arrays on every side)


def make_data(batch_size: int, steps: int, seq_length: int, num_tags: int, seed: int):
    """Random tagging data for `steps` full batches: (ids, mask, type ids, labels), numpy
    int64 [N, S] with N = batch_size * steps; labels -1 off the real tokens."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = batch_size * steps
    lengths = rng.integers(max(1, seq_length // 3), seq_length + 1, size=n)
    mask = (np.arange(seq_length)[None, :] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(*ID_RANGE, size=(n, seq_length)) * mask
    labels = np.where(mask == 1, rng.integers(0, num_tags, size=(n, seq_length)), -1)
    return ids, mask, np.zeros_like(ids), labels


def _step_summary(stamps: list[float], warmup: int) -> dict:
    """Step times (ms) from perf_counter stamps: stamps[0] before the first step, then one
    at the end of each."""
    step_ms = [round((b - a) * 1000, 2) for a, b in itertools.pairwise(stamps)]
    timed = step_ms[warmup:]
    return {"steps_run": len(step_ms), "step_ms": step_ms,
            "ms_per_step": round(statistics.median(timed), 2),
            "ms_per_step_mean": round(statistics.mean(timed), 2)}


# ------------------------------------------------------------------------------------------
# Workers (one process per run)


def run_ours(spec: dict, stages: Stages) -> dict:
    # bert_keras first: its import sets TF_ENABLE_ONEDNN_OPTS when unset, before TensorFlow.
    from bert_keras import model_loading  # noqa: I001
    from bert_keras.finetuning import loop
    from bert_keras.tasks import BertTagger

    import keras
    import tensorflow as tf
    from tensorflow.python.util import _pywrap_util_port

    stages.mark("imports")
    keras.utils.set_random_seed(spec["seed"])
    checkpoint = model_loading.load_checkpoint(spec["init"], want="encoder")
    model = BertTagger(checkpoint.encoder, spec["num_tags"],
                       skip_padding=spec["side"] != "ours_padded")
    stages.mark("model loaded")
    batch, steps, warmup = spec["batch_size"], spec["steps"], spec["warmup_steps"]
    ids, mask, types, labels = make_data(batch, steps, spec["seq_length"], spec["num_tags"],
                                         spec["seed"])
    x = {"input_word_ids": ids.astype("int32"), "input_mask": mask.astype("int32"),
         "input_type_ids": types.astype("int32")}
    y = {"logits": labels.astype("int32")}

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.stamps: list[float] = []
            self.loss = None

        def on_train_begin(self, logs=None):
            self.stamps = [time.perf_counter()]

        def on_train_batch_end(self, batch_index, logs=None):
            self.stamps.append(time.perf_counter())
            if batch_index + 1 == warmup:
                stages.mark(f"after {warmup} steps")
            if batch_index + 1 == steps:
                self.loss = float((logs or {}).get("loss", float("nan")))  # running mean

    timer = Timer()
    if spec["side"] == "ours_keras_adamw":
        from bert_keras.optimization import WarmupLinearDecay
        from bert_keras.tasks import compile_args

        schedule = WarmupLinearDecay(LEARNING_RATE, steps, int(steps * WARMUP_PROPORTION))
        model.compile(optimizer=keras.optimizers.AdamW(
            schedule, weight_decay=WEIGHT_DECAY, epsilon=ADAM_EPSILON,
            global_clipnorm=CLIP_NORM), **compile_args(model))
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0,
                  callbacks=[timer])
    else:
        loop.train(model, x, y, batch, 1.0, LEARNING_RATE, WARMUP_PROPORTION,
                   seed=spec["seed"], num_train_steps=steps, callbacks=[timer],
                   weight_decay=WEIGHT_DECAY, epsilon=ADAM_EPSILON, global_clipnorm=CLIP_NORM)
    stages.mark("trained")
    return {**_step_summary(timer.stamps, warmup), "loss_mean": timer.loss,
            "onednn_env": os.environ.get(ONEDNN_ENV),
            "onednn_enabled": bool(_pywrap_util_port.IsMklEnabled()),
            "threads": tf.config.threading.get_intra_op_parallelism_threads() or "default",
            "versions": {"tensorflow": tf.__version__, "keras": keras.__version__}}


def run_transformers(spec: dict, stages: Stages) -> dict:
    import torch
    import transformers

    stages.mark("imports")
    transformers.set_seed(spec["seed"])
    model = transformers.BertForTokenClassification.from_pretrained(
        spec["init"], num_labels=spec["num_tags"])
    stages.mark("model loaded")
    batch, steps, warmup = spec["batch_size"], spec["steps"], spec["warmup_steps"]
    ids, mask, types, labels = make_data(batch, steps, spec["seq_length"], spec["num_tags"],
                                         spec["seed"])
    labels[labels == -1] = -100
    tensors = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask),
               "token_type_ids": torch.from_numpy(types)}
    targets = torch.from_numpy(labels)

    optimizer, schedule = torch_optimizer(model, LEARNING_RATE, steps,
                                          int(steps * WARMUP_PROPORTION))
    model.train()
    losses = []
    stamps = [time.perf_counter()]
    for step in range(steps):
        part = slice(step * batch, (step + 1) * batch)
        losses.append(torch_step(model, optimizer, schedule,
                                 {k: v[part] for k, v in tensors.items()}, targets[part]))
        stamps.append(time.perf_counter())
        if step + 1 == warmup:
            stages.mark(f"after {warmup} steps")
    stages.mark("trained")
    return {**_step_summary(stamps, warmup), "loss_mean": statistics.mean(losses),
            "threads": torch.get_num_threads(),
            "mkldnn_available": torch.backends.mkldnn.is_available(),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}


def worker(spec_path: str, result_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    stages = Stages()
    result = (run_transformers if spec["side"] == "transformers" else run_ours)(spec, stages)
    result["peak_anon_mb"] = stages.stop()
    result["vm_hwm_mb"] = rss_mb()["peak"]
    result["stages"] = stages.stages
    Path(result_path).write_text(json.dumps(result, indent=1))
    return 0


# ------------------------------------------------------------------------------------------
# Parent: runs, tables, line fit


def run_one(spec: dict, work: Path) -> dict:
    name = f"{spec['side']}_b{spec['batch_size']}_round{spec['round']}"
    runs = work / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    spec_path, result_path, log_path = (runs / f"{name}.spec.json", runs / f"{name}.json",
                                        runs / f"{name}.log")
    spec_path.write_text(json.dumps(spec, indent=1))
    result_path.unlink(missing_ok=True)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}
    env.pop(ONEDNN_ENV, None)  # ours: bert_keras's default, whatever this shell exports
    if spec["side"] == "ours_no_onednn":
        env[ONEDNN_ENV] = "0"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path),
           str(result_path)]
    start = time.time()
    with open(log_path, "w") as log:
        process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"{name} failed (exit {code}):\n{log_path.read_text()[-3000:]}")
    result = json.loads(result_path.read_text())
    # ru_maxrss: KiB on Linux, of this child alone (the parent waits for one at a time).
    result.update(side=spec["side"], batch_size=spec["batch_size"], round=spec["round"],
                  peak_rss_mb=round(usage.ru_maxrss / 1024, 1),
                  wall_seconds=round(time.time() - start, 1))
    onednn = ""
    if "onednn_enabled" in result:
        onednn = f", oneDNN {'on' if result['onednn_enabled'] else 'off'}"
    print(f"{name}: {result['ms_per_step']} ms/step (median of {spec['steps'] - spec['warmup_steps']}), "
          f"peak RSS {result['peak_rss_mb']} MB, peak anonymous {result['peak_anon_mb']} MB"
          f"{onednn}", flush=True)
    return result


def line_fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares line y = slope * x + intercept through (x, y) points; (slope, intercept)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("line_fit needs two or more distinct x values")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, my - slope * mx


def summarize(runs: list[dict], sides: list[str], batch_sizes: list[int]) -> dict:
    """Per batch size and side: median ms/step over rounds (of each round's median),
    examples/s, mean peak RSS; per side, the line fits over batch sizes."""
    table = {}
    for b in batch_sizes:
        for side in sides:
            mine = [r for r in runs if r["batch_size"] == b and r["side"] == side]
            ms = statistics.median(r["ms_per_step"] for r in mine)
            onednn = {r.get("onednn_enabled") for r in mine}
            table.setdefault(str(b), {})[side] = {
                "ms_per_step": round(ms, 1), "rounds_ms": [r["ms_per_step"] for r in mine],
                "examples_per_second": round(b / ms * 1000, 2),
                "peak_rss_mb": round(statistics.mean(r["peak_rss_mb"] for r in mine), 1),
                "peak_anon_mb": round(statistics.mean(r["peak_anon_mb"] for r in mine), 1),
                "onednn": onednn.pop() if len(onednn) == 1 else None}
    fits = {}
    if len(batch_sizes) >= 2:
        for side in sides:
            mine = [r for r in runs if r["side"] == side]
            fits[side] = {}
            for key in ("peak_anon_mb", "peak_rss_mb"):
                slope, intercept = line_fit([(r["batch_size"], r[key]) for r in mine])
                fits[side][key] = {"mb_per_example": round(slope, 2),
                                   "mb_at_batch_0": round(intercept, 1)}
    return {"by_batch_size": table, "fits": fits}


def markdown(summary: dict, sides: list[str], args) -> str:
    out = []
    for b, by_side in summary["by_batch_size"].items():
        out += [(f"B{b} x S{args.seq_length}, {args.num_tags} tags, {args.steps} steps "
                 f"({args.steps - args.warmup_steps} timed), {args.rounds} round(s):"), "",
                ("| side | oneDNN | ms/step, median (per round) | examples/s | / transformers "
                 "| peak RSS (MB) | peak anonymous RSS (MB) |"),
                "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        theirs = by_side.get("transformers")
        for side in sides:
            s = by_side[side]
            onednn = "" if s["onednn"] is None else ("on" if s["onednn"] else "off")
            rounds = ", ".join(f"{v:.0f}" for v in s["rounds_ms"])
            ratio = (f"{s['examples_per_second'] / theirs['examples_per_second']:.2f}x"
                     if theirs and side != "transformers" else "")
            out.append(f"| {side} | {onednn} | {s['ms_per_step']:.0f} ({rounds}) | "
                       f"{s['examples_per_second']:.1f} | {ratio} | {s['peak_rss_mb']:.0f} | "
                       f"{s['peak_anon_mb']:.0f} |")
        out.append("")
    if summary["fits"]:
        sizes = ", ".join(summary["by_batch_size"])
        out += [f"Least-squares line against batch size (B = {sizes}):", "",
                ("| side | peak anonymous, MB per example | peak anonymous at B = 0 (MB) "
                 "| peak RSS, MB per example | peak RSS at B = 0 (MB) |"),
                "| --- | ---: | ---: | ---: | ---: |"]
        for side in sides:
            anon, peak = summary["fits"][side]["peak_anon_mb"], summary["fits"][side]["peak_rss_mb"]
            out.append(f"| {side} | {anon['mb_per_example']:.1f} | {anon['mb_at_batch_0']:.0f} | "
                       f"{peak['mb_per_example']:.1f} | {peak['mb_at_batch_0']:.0f} |")
        out.append("")
    return "\n".join(out)


def _cpu() -> dict:
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {"model": model or platform.processor(), "cores": os.cpu_count(),
            "avx2": "avx2" in flags, "avx512f": "avx512f" in flags}


def _int_list(flag: str, text: str, parser) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        parser.error(f"{flag}: expected comma-separated integers; received {text!r}")
    if not values:
        parser.error(f"{flag}: no value in {text!r}")
    return values


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker(*argv[1:3])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--work_dir", required=True, help="runs, results.json and results.md go here")
    parser.add_argument("--init", choices=("minilm", "tiny"), default="minilm")
    parser.add_argument("--sides", default=",".join(DEFAULT_SIDES),
                        help=f"comma-separated, some of {', '.join(SIDES)}")
    parser.add_argument("--batch_sizes", default="32",
                        help="comma-separated; two or more add a line fit of memory against batch size")
    parser.add_argument("--seq_length", type=int, default=64)
    parser.add_argument("--num_tags", type=int, default=190, help="tags of the tagger (Brown POS: 190)")
    parser.add_argument("--steps", type=int, default=30, help="updates per run, warm-up included")
    parser.add_argument("--warmup_steps", type=int, default=5,
                        help="first updates left out of the timing")
    parser.add_argument("--rounds", type=int, default=2, help="runs per side and batch size")
    parser.add_argument("--seed", type=int, default=0, help="data and initialisation seed")
    args = parser.parse_args(argv)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = [s for s in sides if s not in SIDES]
    if not sides or unknown:
        parser.error(f"--sides: unknown {unknown} in {args.sides!r}; expected some of {list(SIDES)}")
    if len(set(sides)) != len(sides):
        parser.error(f"--sides: a side named twice in {args.sides!r}")
    batch_sizes = _int_list("--batch_sizes", args.batch_sizes, parser)
    if min(batch_sizes) < 1:
        parser.error(f"--batch_sizes: each must be >= 1 (received {args.batch_sizes!r}); batch 0 "
                     "cannot run: give two or more sizes and the line fit reports B = 0")
    if len(set(batch_sizes)) != len(batch_sizes):
        parser.error(f"--batch_sizes: a size named twice in {args.batch_sizes!r}")
    if args.steps < 1:
        parser.error(f"--steps must be >= 1; received {args.steps}")
    if not 0 <= args.warmup_steps < args.steps:
        parser.error(f"--warmup_steps must be in [0, --steps={args.steps}) so that a step is "
                     f"timed; received {args.warmup_steps}")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1; received {args.rounds}")
    if args.seq_length < 2:
        parser.error(f"--seq_length must be >= 2; received {args.seq_length}")
    if args.num_tags < 1:
        parser.error(f"--num_tags must be >= 1; received {args.num_tags}")

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    init = prepare_init(work, args.init)
    config = json.loads((Path(init) / "config.json").read_text())
    if args.seq_length > config["max_position_embeddings"]:
        parser.error(f"--seq_length={args.seq_length} is longer than the model's "
                     f"max_position_embeddings={config['max_position_embeddings']}")
    if config["vocab_size"] < ID_RANGE[1]:
        parser.error(f"the model's vocabulary ({config['vocab_size']}) is smaller than the "
                     f"random word ids' range {ID_RANGE}")

    load_average = [round(v, 2) for v in os.getloadavg()]
    runs = []
    base = {"init": str(init), "seq_length": args.seq_length, "num_tags": args.num_tags,
            "steps": args.steps, "warmup_steps": args.warmup_steps, "seed": args.seed}
    for r in range(args.rounds):
        for i, b in enumerate(batch_sizes):
            order = sides if (r + i) % 2 == 0 else sides[::-1]  # alternate who runs first
            for side in order:
                runs.append(run_one({**base, "side": side, "batch_size": b, "round": r}, work))

    summary = summarize(runs, sides, batch_sizes)
    versions = {"python": platform.python_version()}
    for run in runs:
        versions.update(run.pop("versions", {}))
    command = "python bench/bench_finetune_step.py " + " ".join(argv)
    report = {"command": command, "init": str(init),
              "model": {k: config[k] for k in (*TINY, "vocab_size")},  # its size, tiny or not
              "versions": versions, "cpu": _cpu(),
              "load_average_at_start": load_average,
              "summary": summary, "runs": runs}
    md = markdown(summary, sides, args)
    (work / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    (work / "results.md").write_text(f"`{command}`\n\n{md}")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
