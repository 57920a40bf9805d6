r"""Side by side: fine-tuning with bert-keras's tools and with Hugging Face transformers (torch),
from the same weights, on the same data, with the same hyper-parameters and seeds.

    python bench/bench_finetune_vs_transformers.py --work_dir=/tmp/ftbench   # MiniLM, full size
    python bench/bench_finetune_vs_transformers.py --work_dir=/tmp/smoke --init=tiny \
        --spam_train=48 --spam_test=32 --pos_train=48 --pos_test=32 --seeds=1,2   # smoke test

Tasks (public_data.prepare, seeded with --data_seed, the same files for both sides):
  spam  SpamAssassin ham/spam, --spam_train / --spam_test emails, accuracy
  pos   Brown POS (190 tags, held out by document), --pos_train / --pos_test sentences,
        token accuracy over every word (words cut off by the sequence length count as wrong)

Init (--init): `minilm`, the real MiniLM-L6 weights (`python -m public_data.fetch minilm`,
a Hugging Face directory both libraries read); `tiny`, a randomly initialised 2-layer
transformers BertModel saved with `save_pretrained` beside MiniLM's vocabulary (smoke tests),
which bert-keras loads through its own checkpoint loader.

Each run is its own process (one at a time, ours and theirs alternating first), so peak RSS
(`os.wait4`'s ru_maxrss) is that run's alone:
  ours    `bert_keras.run_classifier` / `run_tagger` as a user runs them (train, save the
          model directory, evaluate), defaults for everything the flags below do not set;
          training is padding-free (the tools' default `--skip_padding`: the encoder's
          layers run on real tokens only, with the padded computation's loss and gradients)
  ours_padded  the same with `--noskip_padding`: every padded position computed, as
          transformers does (an optional third side, --sides=ours,transformers,ours_padded)
  theirs  BertForSequenceClassification / BertForTokenClassification with the loop of
          transformers' own examples: torch AdamW (no decay on biases and LayerNorm),
          `get_linear_schedule_with_warmup`, gradient clipping at global norm 1.0,
          `save_pretrained`, evaluation under `torch.inference_mode`
Both: batch --batch_size (full batches, int(N / batch * epochs) updates), peak learning
rate --learning_rate, --warmup_proportion, weight decay 0.01, Adam epsilon 1e-6, dropout 0.1,
sequences padded to the task's length, evaluation batch --eval_batch_size.

Reported per run: accuracy, steady-state training examples/s (after the first update,
which traces / warms up), prediction examples/s (the whole evaluation pass), memory, and
RSS at each stage (after imports, model load, training, saving, evaluation), which shows
where the memory goes. Memory, two figures (issue 42 decided which is the target):
  peak anonymous RSS  THE TARGET: heap, tensors, optimizer state, what each library's code
                      allocates; ours should be no higher than transformers' in the same run
  peak RSS (total)    reported beside it: anonymous plus the file-backed pages of mapped
                      libraries, itemized (TensorFlow's ~450 MB at import, tensorflow-text's,
                      torch's ~90 MB, the rest), which a process cannot shrink by its own work
                      and which are shared between processes that map the same files
Writes <work_dir>/results.json and results.md.

Without network access, `--init=tiny --tiny_vocab=tests/testdata/pretrain_vocab.txt` builds
the tiny model around a local vocabulary instead of MiniLM's (a smoke run of the printout).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TASKS = ("spam", "pos")
SIDES = ("ours", "transformers", "ours_padded")
DEFAULT_SIDES = ("ours", "transformers")
WEIGHT_DECAY, ADAM_EPSILON, CLIP_NORM = 0.01, 1e-6, 1.0
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
            max_position_embeddings=128)


def rss_mb() -> dict:
    """This process's resident memory, MB (Linux /proc): total, its peak, and the total split
    into anonymous memory (heap, tensors) and file-backed pages (mapped library code)."""
    keys = {"VmRSS": "rss", "VmHWM": "peak", "RssAnon": "anon", "RssFile": "file"}
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in keys:
                out[keys[key]] = round(int(line.split()[1]) / 1024, 1)
    return out


# Mapped files whose resident pages are itemized, by the path part that names them.
MAPPED_LIBRARIES = (("tensorflow_text", "/tensorflow_text/"), ("tensorflow", "/tensorflow/"),
                    ("torch", "/torch/"))


def mapped_library_mb() -> dict:
    """Resident file-backed pages of this process's mapped files, MB (/proc/self/smaps),
    itemized: tensorflow, tensorflow_text, torch, and `other` files (libpython, numpy, ...)."""
    out = {name: 0.0 for name, _ in MAPPED_LIBRARIES}
    out["other"] = 0.0
    path = None
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 5 and "-" in fields[0] and ":" in fields[3]:  # a mapping's header
                path = fields[5] if len(fields) > 5 and fields[5].startswith("/") else None
            elif fields and fields[0] == "Rss:" and path:
                name = next((n for n, part in MAPPED_LIBRARIES if part in path), "other")
                out[name] += int(fields[1]) / 1024
    return {k: round(v, 1) for k, v in out.items()}


class Stages:
    """RSS after each named stage of a run, and the peak of anonymous memory (sampled every
    20 ms by a thread: the kernel keeps a peak of the total only)."""

    def __init__(self):
        import threading

        self.stages: list[dict] = []
        self.peak_anon = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self):
        while not self._stop.wait(0.02):
            self.peak_anon = max(self.peak_anon, rss_mb()["anon"])

    def mark(self, name: str) -> None:
        now = rss_mb()
        self.peak_anon = max(self.peak_anon, now["anon"])
        self.stages.append({"stage": name, **now})

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_anon


# ------------------------------------------------------------------------------------------
# Data and initial weights (parent process)


def prepare_data(work: Path, args) -> dict[str, Path]:
    from public_data import prepare

    out = {}
    for task in args.tasks:
        name = "brown_pos" if task == "pos" else "spam"
        train, test = (args.pos_train, args.pos_test) if task == "pos" else (args.spam_train, args.spam_test)
        directory = work / "data" / f"{task}_{train}_{test}_{args.data_seed}"
        if not (directory / "summary.json").exists():
            prepare.prepare(name, str(directory), train, test, args.data_seed)
        out[task] = directory
    return out


def prepare_init(work: Path, kind: str, tiny_vocab: str | None = None) -> Path:
    if kind == "minilm" or not tiny_vocab:
        from public_data import fetch

        minilm = fetch.fetch_minilm()
        if kind == "minilm":
            return minilm
    vocab = Path(tiny_vocab) if tiny_vocab else minilm / "vocab.txt"
    directory = work / "init_tiny"
    if not (directory / "model.safetensors").exists():
        import shutil

        import torch
        import transformers

        torch.manual_seed(0)
        vocab_size = sum(1 for _ in open(vocab, encoding="utf-8"))
        config = transformers.BertConfig(vocab_size=vocab_size, **TINY)
        transformers.BertModel(config).save_pretrained(str(directory), safe_serialization=True)
        shutil.copy(vocab, directory / "vocab.txt")
    return directory


# ------------------------------------------------------------------------------------------
# Workers (one process per run)


def _task_files(spec: dict) -> dict:
    data = Path(spec["data_dir"])
    if spec["task"] == "pos":
        return {"train": data / "train.conll", "test": data / "test.conll", "labels": data / "tags.txt"}
    return {"train": data / "train.jsonl", "test": data / "test.jsonl"}


def run_ours(spec: dict, stages: Stages) -> dict:
    from bert_keras import model_loading
    from bert_keras import run_classifier, run_tagger
    from bert_keras.finetuning import loop

    if spec["threads"]:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(spec["threads"])
        tf.config.threading.set_inter_op_parallelism_threads(1)
    stages.mark("imports")

    def staged(module, name, label):
        original = getattr(module, name)

        def wrapper(*a, **k):
            result = original(*a, **k)
            stages.mark(label)
            return result

        setattr(module, name, wrapper)

    staged(model_loading, "load_checkpoint", "model loaded")
    staged(loop, "train", "trained")
    staged(model_loading, "save_task_dir", "model saved")
    staged(loop, "predict", "evaluated")
    files = _task_files(spec)
    values = dict(init_checkpoint=spec["init"], vocab_file=os.path.join(spec["init"], "vocab.txt"),
                  output_dir=spec["output_dir"], do_train=True, do_eval=True,
                  train_file=str(files["train"]), eval_file=str(files["test"]),
                  max_seq_length=spec["seq_length"], train_batch_size=spec["batch_size"],
                  eval_batch_size=spec["eval_batch_size"], learning_rate=spec["learning_rate"],
                  num_train_epochs=spec["epochs"], warmup_proportion=spec["warmup_proportion"],
                  seed=spec["seed"], overwrite_output=True)
    if spec.get("head_initializer"):
        values["head_initializer"] = spec["head_initializer"]
    if spec["side"] == "ours_padded":
        values["skip_padding"] = False
    if spec["task"] == "pos":
        results = run_tagger.run(label_list_file=str(files["labels"]), **values)
        accuracy = results["eval"]["token_accuracy"]
    else:
        results = run_classifier.run(**values)
        accuracy = results["eval"]["accuracy"]
    train = results["train"]
    import tensorflow as tf

    return {"accuracy": accuracy, "train_steps": train["num_train_steps"],
            "threads": tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count(),
            "train_examples_per_second": train.get("steady_examples_per_second"),
            "train_seconds": train["seconds"],
            "predict_examples_per_second": results["eval"]["eval_examples_per_second"],
            "loss_last": train["loss_history"][-1]["loss"]}


def _hf_classification(spec, tokenizer, files):
    import numpy as np

    from data_prep.classification import read_examples

    train, test = read_examples(str(files["train"])), read_examples(str(files["test"]))
    labels = sorted({e.label for e in train})

    def encode(examples):
        enc = tokenizer([e.text_a for e in examples], truncation=True,
                        max_length=spec["seq_length"], padding="max_length", return_tensors="np")
        y = np.array([labels.index(e.label) for e in examples])
        return dict(enc), y

    return labels, encode(train), encode(test), None


def _hf_tagging(spec, tokenizer, files):
    import numpy as np

    from data_prep.tagging import read_conll

    labels = [line.strip() for line in open(files["labels"], encoding="utf-8") if line.strip()]
    index = {t: i for i, t in enumerate(labels)}

    def encode(sentences):
        enc = tokenizer([list(s.words) for s in sentences], is_split_into_words=True,
                        truncation=True, max_length=spec["seq_length"], padding="max_length")
        y = np.full((len(sentences), spec["seq_length"]), -100, dtype=np.int64)
        first = []  # per sentence, the first sub-token position of each word (-1: none)
        for i, s in enumerate(sentences):
            positions = [-1] * len(s.words)
            for p, w in enumerate(enc.word_ids(i)):
                if w is not None and positions[w] == -1:
                    positions[w] = p
                    y[i, p] = index[s.tags[w]]
            first.append(positions)
        arrays = {k: np.asarray(v) for k, v in enc.items()}
        return (arrays, y), first

    (train, _), (test, test_first) = encode(read_conll(str(files["train"]))), \
        encode(read_conll(str(files["test"])))
    return labels, train, test, test_first



def torch_optimizer(model, learning_rate: float, steps: int, warmup: int):
    """transformers' example set-up: torch AdamW with no decay on biases and LayerNorm
    weights, epsilon ADAM_EPSILON, and `get_linear_schedule_with_warmup`."""
    import torch
    import transformers

    no_decay = ("bias", "LayerNorm.weight")
    groups = [{"params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)],
               "weight_decay": WEIGHT_DECAY},
              {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)],
               "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=learning_rate, eps=ADAM_EPSILON)
    return optimizer, transformers.get_linear_schedule_with_warmup(optimizer, warmup, steps)


def torch_step(model, optimizer, schedule, inputs: dict, labels) -> float:
    """One update of transformers' example loop (clip at CLIP_NORM); returns the loss."""
    import torch

    out = model(**inputs, labels=labels)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad()
    return float(out.loss.detach())


def run_transformers(spec: dict, stages: Stages) -> dict:
    import numpy as np
    import torch
    import transformers

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    stages.mark("imports")
    transformers.set_seed(spec["seed"])
    tokenizer = transformers.BertTokenizerFast(os.path.join(spec["init"], "vocab.txt"),
                                               do_lower_case=True)
    files = _task_files(spec)
    pos = spec["task"] == "pos"
    labels, (x_train, y_train), (x_test, y_test), test_first = (
        _hf_tagging if pos else _hf_classification)(spec, tokenizer, files)
    model_class = (transformers.BertForTokenClassification if pos
                   else transformers.BertForSequenceClassification)
    model = model_class.from_pretrained(spec["init"], num_labels=len(labels))
    stages.mark("model loaded")

    n, batch = len(y_train), spec["batch_size"]
    steps = max(1, int(n / batch * spec["epochs"]))
    optimizer, schedule = torch_optimizer(model, spec["learning_rate"], steps,
                                          int(steps * spec["warmup_proportion"]))
    generator = torch.Generator().manual_seed(spec["seed"])
    tensors = {k: torch.from_numpy(v) for k, v in x_train.items()}
    targets = torch.from_numpy(y_train)
    model.train()
    order, step, first_end, losses = [], 0, None, []
    start = time.time()
    while step < steps:
        if len(order) < batch:  # a new shuffled epoch; full batches only
            order = torch.randperm(n, generator=generator).tolist()
        idx, order = order[:batch], order[batch:]
        losses.append(torch_step(model, optimizer, schedule,
                                 {k: v[idx] for k, v in tensors.items()}, targets[idx]))
        step += 1
        if step == 1:
            first_end = time.time()
    end = time.time()
    stages.mark("trained")
    model.save_pretrained(spec["output_dir"])
    stages.mark("model saved")

    model.eval()
    logits = []
    test_tensors = {k: torch.from_numpy(v) for k, v in x_test.items()}
    eval_batch = spec["eval_batch_size"]
    predict_start = time.time()
    with torch.inference_mode():
        for begin in range(0, len(y_test), eval_batch):
            logits.append(model(**{k: v[begin:begin + eval_batch]
                                   for k, v in test_tensors.items()}).logits.numpy())
    predict_seconds = time.time() - predict_start
    stages.mark("evaluated")
    predicted = np.concatenate(logits).argmax(-1)
    if pos:
        gold = [line.split()[-1] for line in open(files["test"], encoding="utf-8") if line.strip()]
        # Gold per word comes from the file; each word's prediction is at its first
        # sub-token, and a word cut off (or tokenized to nothing) counts as wrong.
        from data_prep.tagging import read_conll

        sentences = read_conll(str(files["test"]))
        correct = total = 0
        for i, s in enumerate(sentences):
            for w, p in enumerate(test_first[i]):
                total += 1
                correct += p >= 0 and labels[predicted[i, p]] == s.tags[w]
        assert total == len(gold)
        accuracy = correct / total
    else:
        accuracy = float((predicted == y_test).mean())
    return {"accuracy": accuracy, "train_steps": steps, "threads": torch.get_num_threads(),
            "train_examples_per_second": round(batch * (steps - 1) / (end - first_end), 2)
            if steps > 1 else None,
            "train_seconds": round(end - start, 1),
            "predict_examples_per_second": round(len(y_test) / predict_seconds, 2),
            "loss_last": float(np.mean(losses[-50:]))}


def worker(spec_path: str, result_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    stages = Stages()
    result = (run_transformers if spec["side"] == "transformers" else run_ours)(spec, stages)
    result["peak_anon_mb"] = stages.stop()
    result["mapped_mb"] = mapped_library_mb()  # file pages stay mapped once imported
    result["stages"] = stages.stages
    Path(result_path).write_text(json.dumps(result, indent=1))
    return 0


# ------------------------------------------------------------------------------------------
# Parent: runs, table


def run_one(spec: dict, work: Path, nice: int) -> dict:
    name = f"{spec['task']}_{spec['side']}_seed{spec['seed']}"
    spec = {**spec, "output_dir": str(work / "runs" / name)}
    spec_path, result_path = work / "runs" / f"{name}.spec.json", work / "runs" / f"{name}.json"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(json.dumps(spec, indent=1))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path), str(result_path)]
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}
    log = open(work / "runs" / f"{name}.log", "w")
    start = time.time()
    process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    log.close()
    if process.returncode != 0:
        tail = (work / "runs" / f"{name}.log").read_text()[-2000:]
        raise RuntimeError(f"{name} failed (exit {process.returncode}):\n{tail}")
    result = json.loads(result_path.read_text())
    # ru_maxrss is in KiB on Linux; `nice` execs the worker, so this is the worker's own peak.
    result.update(peak_rss_mb=round(usage.ru_maxrss / 1024, 1), wall_seconds=round(time.time() - start, 1),
                  task=spec["task"], side=spec["side"], seed=spec["seed"])
    print(f"{name}: accuracy {result['accuracy']:.4f}, train {result['train_examples_per_second']} ex/s, "
          f"predict {result['predict_examples_per_second']} ex/s; {memory_line(result)}",
          flush=True)
    return result


def memory_line(result: dict) -> str:
    """The two memory figures of a run, the target first, the total's mapped pages itemized."""
    mapped = result["mapped_mb"]
    parts = [f"TensorFlow {mapped['tensorflow']:.0f}", f"tensorflow-text "
             f"{mapped['tensorflow_text']:.0f}", f"torch {mapped['torch']:.0f}",
             f"other files {mapped['other']:.0f}"]
    return (f"peak anonymous RSS {result['peak_anon_mb']:.0f} MB (the target); total peak RSS "
            f"{result['peak_rss_mb']:.0f} MB (mapped library pages, MB: {', '.join(parts)})")


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else float("nan")


def table(runs: list[dict], args) -> str:
    sides = [s for s in SIDES if any(r["side"] == s for r in runs)]
    names = {"ours_padded": "ours, padded"}
    lines = ["| task | measure | " + " | ".join(names.get(s, s) for s in sides)
             + " | ours / transformers |",
             "| --- | --- | " + "--- | " * len(sides) + "--- |"]
    for task in args.tasks:
        by_side = {side: [r for r in runs if r["task"] == task and r["side"] == side]
                   for side in SIDES}
        for key, label, fmt in (("accuracy", "accuracy (%)", "{:.2f}"),
                                ("train_examples_per_second", "training examples/s", "{:.1f}"),
                                ("predict_examples_per_second", "prediction examples/s", "{:.1f}"),
                                ("peak_anon_mb", "**peak anonymous RSS (MB): the target**",
                                 "{:.0f}"),
                                ("peak_rss_mb", "peak RSS, total (MB)", "{:.0f}"),
                                *[(f"mapped:{lib}", f"of which mapped pages of {name} (MB)",
                                   "{:.0f}") for lib, name in MAPPED_NAMES]):
            scale = 100 if key == "accuracy" else 1
            means = {s: _mean([_value(r, key) for r in by_side[s]]) * scale for s in SIDES}
            cells = []
            for s in sides:
                cell = fmt.format(means[s])
                if key == "accuracy":
                    cell += " (" + ", ".join(fmt.format(r[key] * 100) for r in by_side[s]) + ")"
                cells.append(cell)
            if not (by_side["ours"] and by_side["transformers"]):
                ratio = ""
            elif key == "accuracy":
                ratio = f"{means['ours'] - means['transformers']:+.2f} points"
            elif means["transformers"]:
                ratio = f"{means['ours'] / means['transformers']:.2f}x"
            else:  # a library the transformers side does not map (TensorFlow's pages)
                ratio = ""
            lines.append(f"| {task} | {label} | {' | '.join(cells)} | {ratio} |")
    lines.append("")
    lines.append("Memory target: peak anonymous RSS (heap and tensors: what the run allocates) no "
                 "higher than transformers'; the total peak RSS adds the resident pages of mapped "
                 "library files, itemized above (fixed per library, shared between processes).")
    return "\n".join(lines) + "\n"


MAPPED_NAMES = (("tensorflow", "TensorFlow"), ("tensorflow_text", "tensorflow-text"),
                ("torch", "torch"), ("other", "other files"))


def _value(run: dict, key: str):
    if key.startswith("mapped:"):
        return run.get("mapped_mb", {}).get(key.split(":", 1)[1])
    return run[key]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker(*argv[1:3])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work_dir", required=True, help="data, runs and results go here")
    parser.add_argument("--init", choices=("minilm", "tiny"), default="minilm")
    parser.add_argument("--tiny_vocab", help="--init=tiny: the vocabulary to build the tiny "
                        "model around (default: MiniLM's, fetched)")
    parser.add_argument("--tasks", default="spam,pos", help="comma-separated: spam, pos")
    parser.add_argument("--seeds", default="12345,23456", help="comma-separated fine-tuning seeds")
    parser.add_argument("--data_seed", type=int, default=12345)
    parser.add_argument("--spam_train", type=int, default=2000)
    parser.add_argument("--spam_test", type=int, default=1000)
    parser.add_argument("--spam_seq", type=int, default=128)
    parser.add_argument("--spam_epochs", type=float, default=1.0)
    parser.add_argument("--pos_train", type=int, default=4000)
    parser.add_argument("--pos_test", type=int, default=1000)
    parser.add_argument("--pos_seq", type=int, default=64)
    parser.add_argument("--pos_epochs", type=float, default=2.0)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--eval_batch_size", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--warmup_proportion", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=0,
                        help="intra-op threads for both libraries (0: each library's default)")
    parser.add_argument("--nice", type=int, default=0, help="run the workers under nice -n N")
    parser.add_argument("--head_initializer", choices=("normal", "truncated_normal"),
                        help="ours only: the fine-tuning tools' --head_initializer (default: "
                        "theirs, normal); truncated_normal is Google's (A/B runs, BUILD_NOTES 8.5)")
    parser.add_argument("--sides", default=",".join(DEFAULT_SIDES),
                        help="comma-separated: ours, transformers, ours_padded (one side alone: "
                        "A/B runs of one library under different settings)")
    args = parser.parse_args(argv)
    args.tasks = [t for t in args.tasks.split(",") if t]
    unknown = set(args.tasks) - set(TASKS)
    if unknown:
        parser.error(f"--tasks: unknown {sorted(unknown)}; expected some of {list(TASKS)}")
    sides = [s for s in args.sides.split(",") if s]
    if not sides or set(sides) - set(SIDES):
        parser.error(f"--sides: expected some of {list(SIDES)}; received {args.sides!r}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    data = prepare_data(work, args)
    init = prepare_init(work, args.init, args.tiny_vocab)
    runs = []
    for task in args.tasks:
        pos = task == "pos"
        base = dict(task=task, data_dir=str(data[task]), init=str(init),
                    seq_length=args.pos_seq if pos else args.spam_seq,
                    epochs=args.pos_epochs if pos else args.spam_epochs,
                    batch_size=args.batch_size, eval_batch_size=args.eval_batch_size,
                    learning_rate=args.learning_rate, warmup_proportion=args.warmup_proportion,
                    threads=args.threads, head_initializer=args.head_initializer)
        for i, seed in enumerate(seeds):
            order = sides if i % 2 == 0 else sides[::-1]  # alternate who runs first
            for side in order:
                runs.append(run_one({**base, "side": side, "seed": seed}, work, args.nice))
    import platform

    import tensorflow as tf
    import torch
    import transformers

    import keras

    report = {"command": "python bench/bench_finetune_vs_transformers.py " + " ".join(argv),
              "versions": {"tensorflow": tf.__version__, "keras": keras.__version__,
                           "torch": torch.__version__, "transformers": transformers.__version__,
                           "python": platform.python_version()},
              "cpus": os.cpu_count(), "runs": runs}
    from data_prep import files

    files.write_json(str(work / "results.json"), report)
    md = table(runs, args)
    files.write_text(str(work / "results.md"), f"`{report['command']}`\n\n{md}")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
