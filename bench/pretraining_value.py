r"""What our pretraining buys, measured: recipes at equal compute vs random initialisation.

    nice -n 19 python bench/pretraining_value.py all --work_dir=/tmp/pretraining-value \
        --budget_minutes=40                       # the experiment (hours on 2 cores)
    nice -n 19 python bench/pretraining_value.py all --work_dir=/tmp/pv-smoke --smoke

Steps (`all` runs them in order; each is resumable: finished outputs are kept and skipped,
and every tool run is one printed command, saved in <work_dir>/commands.txt):

  prepare    public English text, held out by document -> corpus/{train,heldout}.txt:
             State of the Union addresses (all but the 8 latest) and the Brown corpus's
             training documents (every 10th Brown document is held out: it is the test
             side of the Brown tasks below, so no fine-tuning test text is pretrained on);
             a WordPiece vocabulary learnt from the training text (build_vocab); the
             pretraining data: statically masked (BERT: 15%, P=20, dupe_factor 5), without
             masks (create_pretraining_data --dynamic_masking), and one held-out file with
             static 15% masks on which every recipe is scored; the low-label tasks
             (public_data.prepare): spam (SpamAssassin, 500 labelled emails), genre (Brown,
             500 passages, 15 genres), pos (Brown, 500 sentences), each with a held-out
             test set of 1,000.
  calibrate  seconds per pretraining step of the BERT recipe (a short pilot in this
             process): the budget in minutes becomes a number of optimizer steps, the same
             for every recipe (equal compute: same model, batch and sequence length; the
             recipes differ in what a step learns, not in what it costs, within ~2%).
  pretrain   run_pretraining per recipe (RECIPES below), evaluated on the held-out file
             ten times along the way (history.csv: held-out MLM accuracy curve).
  finetune   run_classifier / run_tagger for every task x initialisation (each recipe's
             encoder, and `random`: the same architecture, randomly initialised) x seed,
             with the same hyperparameters for every initialisation.
  table      results.md: held-out MLM accuracy per recipe and interval (+ curves.png when
             matplotlib is installed), test metrics as mean +- sd over seeds, and the mean
             over tasks per initialisation next to the seed spread.

`--smoke` shrinks everything (tiny model, 30 s budget, 100 examples, 1 seed, a slice of
the corpus) to check that the script works end to end in a few minutes; its numbers mean
nothing.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from data_prep.files import write_text  # noqa: E402
from public_data import fetch  # noqa: E402
from public_data import prepare as prepare_data  # noqa: E402

# The recipes compared. Every one trains the same model for the same number of steps at
# the same batch and sequence length; the held-out file (static 15% masks) is the same.
RECIPES = {
    # Devlin et al. 2018: static masks written dupe_factor times, 15%, NSP, lr 1e-4.
    "bert": dict(data="static", flags=["--learning_rate=1e-4"]),
    # BERT's recipe at the post-BERT learning rate: separates the learning rate's share of
    # the gain from the masking and objective changes.
    "bert_lr": dict(data="static", flags=["--learning_rate=5e-4"]),
    # RoBERTa / Cramming / MosaicBERT / Wettig et al.: masks drawn anew on every pass, 30%,
    # no NSP, a higher peak learning rate.
    "modern": dict(data="dynamic", flags=["--masked_lm_prob=0.3",
                                         "--next_sentence_prediction=false",
                                         "--learning_rate=5e-4"]),
}
DEFAULT_RECIPES = ("bert", "modern")
TASKS = ("spam", "genre", "pos")
# Same hyperparameters for every initialisation: the comparison is about the starting point.
TASK_FLAGS = {
    "spam": ["bert_keras.run_classifier", "--max_seq_length=128", "--train_batch_size=16",
             "--learning_rate=1e-4", "--num_train_epochs=4", "--warmup_proportion=0.1"],
    "genre": ["bert_keras.run_classifier", "--max_seq_length=128", "--train_batch_size=16",
              "--learning_rate=1e-4", "--num_train_epochs=6", "--warmup_proportion=0.1"],
    "pos": ["bert_keras.run_tagger", "--max_seq_length=64", "--train_batch_size=16",
            "--learning_rate=5e-4", "--num_train_epochs=8", "--warmup_proportion=0.1"],
}
TASK_METRIC = {"spam": "accuracy", "genre": "accuracy", "pos": "token_accuracy"}
HELDOUT_SOTU = 8  # the latest addresses


def sizes(args) -> dict:
    """The run's sizes (the experiment's, or --smoke's)."""
    if args.smoke:
        return dict(preset="tiny", seq_length=64, predictions=10, batch=16, vocab=2000,
                    sotu_docs=30, brown_docs=80, dupe_factor=2, train=100, test=100, seeds=1,
                    budget_minutes=0.5, epochs_scale=0.5, evaluations=3)
    return dict(preset=args.preset, seq_length=128, predictions=20, batch=32,
                vocab=args.vocab_size, sotu_docs=None, brown_docs=None, dupe_factor=5,
                train=args.train_size, test=args.test_size, seeds=args.seeds,
                budget_minutes=args.budget_minutes, epochs_scale=1.0, evaluations=10)


def _run(cmd: list[str], log: Path, work: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    printable = " ".join(shlex.quote(str(c)) for c in cmd)
    print(f"$ {printable}\n  (log: {log})", flush=True)
    with open(work / "commands.txt", "a", encoding="utf-8") as f:
        f.write(printable + "\n")
    start = time.time()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.run([str(c) for c in cmd], cwd=REPO, stdout=out,
                              stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"failed (exit {proc.returncode}) after {time.time() - start:.0f} s; "
                         f"see {log}")
    print(f"  done in {time.time() - start:.0f} s", flush=True)


def _py(module: str) -> list[str]:
    return [sys.executable, "-m", module]


# ------------------------------------------------------------------------------------------
# prepare


def _raw_corpus(work: Path, s: dict) -> None:
    """raw/{train,heldout}/*.txt: one document a file, split by document."""
    raw = work / "raw"
    if (raw / "DONE").exists():
        return
    sotu = sorted(fetch.sotu_files())
    documents, train_docs, test_docs = prepare_data._brown_documents_split()
    if s["sotu_docs"]:
        sotu = sotu[-(s["sotu_docs"] + HELDOUT_SOTU):]
        train_docs = train_docs[:s["brown_docs"]]
        test_docs = test_docs[:max(2, s["brown_docs"] // 9)]
    parts = {"train": [(p.name, p.read_text(encoding="utf-8")) for p in sotu[:-HELDOUT_SOTU]],
             "heldout": [(p.name, p.read_text(encoding="utf-8")) for p in sotu[-HELDOUT_SOTU:]]}
    for split, names in (("train", train_docs), ("heldout", test_docs)):
        for name in names:  # Brown as plain text: a sentence a line, its words joined
            text = "\n".join(" ".join(sentence.words) for sentence in documents[name])
            parts[split].append((f"brown_{name}.txt", text + "\n"))
    for split, docs in parts.items():
        (raw / split).mkdir(parents=True, exist_ok=True)
        for name, text in docs:
            write_text(raw / split / name, text)
    write_text(raw / "DONE", json.dumps({k: len(v) for k, v in parts.items()}) + "\n")


def prepare(args) -> None:
    work, s = Path(args.work_dir), sizes(args)
    _raw_corpus(work, s)
    corpus = work / "corpus"
    for split in ("train", "heldout"):
        if not (corpus / f"{split}.txt").exists():
            _run(_py("data_prep.prepare_corpus") + [f"--input={work / 'raw' / split}",
                                                     f"--output_file={corpus / f'{split}.txt'}"],
                 work / "logs" / f"corpus-{split}.log", work)
    vocab = work / "vocab.txt"
    if not vocab.exists():
        _run(_py("data_prep.build_vocab") + [f"--input={corpus / 'train.txt'}",
                                              f"--output={vocab}", f"--vocab_size={s['vocab']}"],
             work / "logs" / "vocab.log", work)
    data = work / "data"
    common = [f"--vocab_file={vocab}", f"--max_seq_length={s['seq_length']}",
              "--num_examples_to_print=0"]
    runs = {
        "static": [f"--input_file={corpus / 'train.txt'}", f"--output_file={data / 'static'}",
                   "--num_output_shards=2", "--num_workers=2",
                   f"--max_predictions_per_seq={s['predictions']}",
                   f"--dupe_factor={s['dupe_factor']}", "--random_seed=1"],
        "dynamic": [f"--input_file={corpus / 'train.txt'}", f"--output_file={data / 'dynamic'}",
                    "--num_output_shards=2", "--num_workers=2", "--dynamic_masking",
                    "--random_seed=1"],
        "heldout": [f"--input_file={corpus / 'heldout.txt'}",
                    f"--output_file={data / 'heldout.tfrecord'}",
                    f"--max_predictions_per_seq={s['predictions']}", "--dupe_factor=1",
                    "--random_seed=2"],
    }
    for name, flags in runs.items():
        if not list(data.glob(f"{name}*.tfrecord")):
            _run(_py("data_prep.create_pretraining_data") + flags + common,
                 work / "logs" / f"data-{name}.log", work)
    config = work / "bert_config.json"
    if not config.exists():
        from bert_keras.config import BertConfig
        from data_prep.schema import load_vocab

        BertConfig.from_preset(s["preset"], vocab_size=len(load_vocab(vocab))).to_json_file(
            str(config))
    for task, public in (("spam", "spam"), ("genre", "brown_genre"), ("pos", "brown_pos")):
        out = work / "tasks" / task
        if not (out / "summary.json").exists():
            prepare_data.prepare(public, str(out), s["train"], s["test"], seed=args.seed)
            print(f"wrote {out}", flush=True)


# ------------------------------------------------------------------------------------------
# calibrate and pretrain


def _pretrain_flags(work: Path, s: dict, recipe: str, steps: int, output_dir: Path) -> list[str]:
    data = RECIPES[recipe]["data"]
    interval = max(1, steps // s["evaluations"])
    flags = [f"--input_file={work / 'data' / f'{data}-*.tfrecord'}",
             f"--eval_input_file={work / 'data' / 'heldout.tfrecord'}",
             f"--bert_config_file={work / 'bert_config.json'}",
             f"--vocab_file={work / 'vocab.txt'}", f"--output_dir={output_dir}",
             f"--max_seq_length={s['seq_length']}", f"--train_batch_size={s['batch']}",
             f"--num_train_steps={steps}", f"--num_warmup_steps={max(1, steps // 10)}",
             f"--save_checkpoints_steps={interval}", "--max_eval_steps=50",
             "--eval_batch_size=32", "--seed=12345"]
    if data == "static":
        flags.append(f"--max_predictions_per_seq={s['predictions']}")
    return flags + RECIPES[recipe]["flags"]


def _option_values(flags: list[str]) -> dict:
    """run_pretraining's "--name=value" flags as PretrainingOptions keyword arguments."""
    import dataclasses

    from bert_keras.run_pretraining import PretrainingOptions

    kinds = {f.name: str(f.type) for f in dataclasses.fields(PretrainingOptions)}
    values = {}
    for flag in flags:
        name, _, value = flag[2:].partition("=")
        kind = kinds[name]
        if kind.startswith("bool"):
            values[name] = value.lower() in ("true", "1", "")
        elif kind.startswith("int"):
            values[name] = int(value)
        elif kind.startswith("float"):
            values[name] = float(value)
        else:
            values[name] = value
    return values


def calibrate(args) -> dict:
    """Seconds per step of the BERT recipe, from a short pilot in this process."""
    work, s = Path(args.work_dir), sizes(args)
    path = work / "calibration.json"
    if path.exists():
        return json.loads(path.read_text())
    import shutil

    import keras

    from bert_keras import run_pretraining

    pilot_steps = 12 if args.smoke else 40
    pilot_dir = work / "pilot"
    shutil.rmtree(pilot_dir, ignore_errors=True)

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self.start)

    flags = [f for f in _pretrain_flags(work, s, "bert", pilot_steps, pilot_dir)
             if not f.startswith(("--eval_input_file", "--save_checkpoints"))]
    values = _option_values(flags)
    values.update(save_checkpoints_steps=pilot_steps, verbose=0)
    timer = Timer()
    run_pretraining.train(run_pretraining.PretrainingOptions(**values), extra_callbacks=[timer])
    shutil.rmtree(pilot_dir, ignore_errors=True)
    warm = timer.times[min(5, len(timer.times) - 1):]
    seconds = statistics.median(warm)
    # A multiple of the evaluations: every checkpoint interval has the same length.
    steps = s["evaluations"] * max(1, int(s["budget_minutes"] * 60 / seconds) // s["evaluations"])
    result = {"seconds_per_step": seconds, "pilot_steps": pilot_steps,
              "budget_minutes": s["budget_minutes"], "steps": steps,
              "command": "python " + " ".join(shlex.quote(a) for a in sys.argv)}
    write_text(path, json.dumps(result, indent=1) + "\n")
    print(f"calibration: {seconds * 1000:.0f} ms a step -> {steps} steps for "
          f"{s['budget_minutes']} minutes", flush=True)
    return result


def pretrain(args) -> None:
    work, s = Path(args.work_dir), sizes(args)
    steps = calibrate(args)["steps"]
    for recipe in args.recipes.split(","):
        out = work / "pretrain" / recipe
        if (out / "encoder").exists():
            print(f"exists, skipped: {out}")
            continue
        _run(_py("bert_keras.run_pretraining") + _pretrain_flags(work, s, recipe, steps, out),
             work / "logs" / f"pretrain-{recipe}.log", work)


# ------------------------------------------------------------------------------------------
# fine-tune


def _finetune_command(work: Path, s: dict, task: str, init: str, seed: int) -> list[str]:
    module, *flags = TASK_FLAGS[task]
    flags = [f.replace(f.split("=")[1], str(float(f.split("=")[1]) * s["epochs_scale"]))
             if f.startswith("--num_train_epochs") else f for f in flags]
    data = work / "tasks" / task
    if task == "pos":
        files = [f"--train_file={data / 'train.conll'}", f"--eval_file={data / 'test.conll'}",
                 f"--label_list_file={data / 'tags.txt'}"]
    else:
        files = [f"--train_file={data / 'train.jsonl'}", f"--eval_file={data / 'test.jsonl'}"]
    if init == "random":
        start = [f"--bert_config_file={work / 'bert_config.json'}"]
    else:
        start = [f"--init_checkpoint={work / 'pretrain' / init / 'encoder'}"]
    return (_py(module) + files + flags + start +
            [f"--vocab_file={work / 'vocab.txt'}", "--do_train", "--do_eval", f"--seed={seed}",
             f"--output_dir={work / 'finetune' / f'{task}-{init}-{seed}'}"])


def finetune(args) -> None:
    work, s = Path(args.work_dir), sizes(args)
    inits = args.recipes.split(",") + ["random"]
    for task in args.tasks.split(","):
        for init in inits:
            for seed in range(1, s["seeds"] + 1):
                out = work / "finetune" / f"{task}-{init}-{seed}"
                if (out / "eval_results.json").exists():
                    print(f"exists, skipped: {out}")
                    continue
                cmd = _finetune_command(work, s, task, init, seed)
                if out.exists():  # an interrupted run: start it again
                    cmd.append("--overwrite_output")
                _run(cmd, work / "logs" / f"finetune-{task}-{init}-{seed}.log", work)


# ------------------------------------------------------------------------------------------
# table


def _curve(work: Path, recipe: str) -> list[tuple[int, float]]:
    path = work / "pretrain" / recipe / "history.csv"
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [(int(r["epoch"]) + 1, float(r["val_mlm_logits_accuracy"])) for r in rows
            if r.get("val_mlm_logits_accuracy")]


def _mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def table(args) -> None:
    work, s = Path(args.work_dir), sizes(args)
    calibration = json.loads((work / "calibration.json").read_text())
    recipes = args.recipes.split(",")
    inits = recipes + ["random"]
    lines = [f"Budget: {calibration['budget_minutes']} minutes of pretraining per recipe = "
             f"{calibration['steps']} steps at {calibration['seconds_per_step'] * 1000:.0f} ms "
             f"(preset {s['preset']}, batch {s['batch']}, sequence length {s['seq_length']}).",
             "", "Held-out MLM accuracy (static 15% masks, the same file for every recipe) "
             "after each checkpoint interval, by pretraining step:", ""]
    curves = {recipe: _curve(work, recipe) for recipe in recipes}
    interval = calibration["steps"] // s["evaluations"]
    intervals = max([len(c) for c in curves.values()] + [1])
    lines += ["| recipe | " + " | ".join(str(min(i * interval, calibration["steps"]))
                                         for i in range(1, intervals + 1)) + " |",
              "| --- |" + " --- |" * intervals]
    for recipe in recipes:
        lines.append(f"| {recipe} | " + " | ".join(f"{100 * a:.1f}%" for _, a in curves[recipe])
                     + " |")
    lines += ["", f"Fine-tuning (test sets of {s['test']}; {s['train']} labelled examples; "
              f"mean +- sd over {s['seeds']} seed(s)):", "",
              "| init | " + " | ".join(TASKS) + " | mean over tasks |",
              "| --- |" + " --- |" * (len(TASKS) + 1)]
    results = {}
    for init in inits:
        cells, per_seed = [], []
        for task in TASKS:
            values = []
            for seed in range(1, s["seeds"] + 1):
                path = work / "finetune" / f"{task}-{init}-{seed}" / "eval_results.json"
                if path.exists():
                    values.append(json.loads(path.read_text())[TASK_METRIC[task]])
            results.setdefault(init, {})[task] = values
            if values:
                mean, sd = _mean_sd(values)
                cells.append(f"{100 * mean:.2f} +- {100 * sd:.2f}")
            else:
                cells.append("-")
        complete = [results[init][t] for t in TASKS if len(results[init][t]) == s["seeds"]]
        if len(complete) == len(TASKS):
            # Mean over tasks, per seed, then mean +- sd of those: the seed spread of the
            # quantity compared.
            per_seed = [statistics.fmean(v[i] for v in complete) for i in range(s["seeds"])]
            mean, sd = _mean_sd(per_seed)
            cells.append(f"{100 * mean:.2f} +- {100 * sd:.2f}")
        else:
            cells.append("-")
        lines.append(f"| {init} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    write_text(work / "results.md", text)
    write_text(work / "results.json", json.dumps(
        {"calibration": calibration, "curves": curves, "finetune": results}, indent=1) + "\n")
    print(text)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: no curves.png; the curves are in results.md)")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for recipe, points in curves.items():
        ax.plot([min(i * interval, calibration["steps"]) for i, _ in points],
                [100 * a for _, a in points], marker="o", label=recipe)
    ax.set_xlabel("pretraining steps")
    ax.set_ylabel("held-out MLM accuracy (%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(work / "curves.png", dpi=120)
    print(f"wrote {work / 'curves.png'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["prepare", "calibrate", "pretrain", "finetune",
                                         "table", "all"])
    parser.add_argument("--work_dir", default=str(fetch.cache_root() / "pretraining-value"))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script")
    parser.add_argument("--budget_minutes", type=float, default=40.0,
                        help="pretraining time per recipe (same steps for every recipe)")
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--train_size", type=int, default=500)
    parser.add_argument("--test_size", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=12345, help="task splits")
    parser.add_argument("--recipes", default=",".join(DEFAULT_RECIPES),
                        help=f"comma-separated, of {sorted(RECIPES)}")
    parser.add_argument("--tasks", default=",".join(TASKS))
    args = parser.parse_args()
    unknown = set(args.recipes.split(",")) - set(RECIPES)
    if unknown:
        parser.error(f"unknown recipes {sorted(unknown)}; expected some of {sorted(RECIPES)}")
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    steps = {"prepare": [prepare], "calibrate": [calibrate], "pretrain": [pretrain],
             "finetune": [finetune], "table": [table],
             "all": [prepare, pretrain, finetune, table]}[args.step]
    for step in steps:
        step(args)


if __name__ == "__main__":
    main()
