r"""Real fine-tuning demonstrations: SpamAssassin spam/ham and Brown-corpus POS tagging, each
fine-tuned from (a) the pretrained MiniLM-L6 weights, (b) our own small pretrained checkpoint,
(c) random initialisation (MiniLM's architecture), with a fixed split and seed; plus
(d) `random_mini`, random initialisation at (b)'s smaller architecture (the mini preset),
the baseline that (b) itself has to beat.

    python bench/finetune_demo.py prepare            # data files + configs into --work_dir
    python bench/finetune_demo.py pretrain           # (b): SOTU -> mini BERT, our tools
    python bench/finetune_demo.py run                # every task x init, one at a time
    python bench/finetune_demo.py table              # results.md from the eval files

Every step is resumable: finished outputs are kept and skipped. Each fine-tuning run is one
`python -m bert_keras.run_classifier|run_tagger` command, printed and saved in
<work_dir>/commands.txt, so any row of the table can be rerun by hand.

Data (DATA.md; fetched through public_data.datasets, checksummed, cached):
  spam   6,046 emails -> Subject + body text (public_data.datasets.email_text); exact duplicate
         texts dropped (the first in group/file order is kept); seeded shuffle, 20% test.
  pos    Brown corpus, 500 documents; every 10th document (ca10, ca20, ...) is test, the rest
         train, so no sentence of a test document is seen in training; seeded samples of
         --pos_train_sentences / --pos_test_sentences sentences; tags without the -tl/-hl/-nc
         and fw- marks (190 tags; label list from the whole corpus).
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from data_prep.files import write_text  # noqa: E402
from public_data import datasets, fetch  # noqa: E402
from public_data import prepare as prepare_data  # noqa: E402

INITS = ("minilm", "ours", "random", "random_mini")
TASKS = ("spam", "pos")


# ------------------------------------------------------------------------------------------
# prepare


def prepare_spam(out: Path, seed: int, test_fraction: float) -> dict:
    # The first `test_fraction` of the shuffled deduplicated emails is the test set (the
    # split of the figures in BUILD_NOTES; public_data.prepare takes sizes instead).
    rows = prepare_data.spam_rows()
    rng = random.Random(seed)
    rng.shuffle(rows)
    n_test = round(len(rows) * test_fraction)
    test, train = rows[:n_test], rows[n_test:]
    for name, part in (("train", train), ("test", test)):
        write_text(out / f"{name}.jsonl", "".join(json.dumps(r) + "\n" for r in part))
    count = lambda part, label: sum(r["label"] == label for r in part)  # noqa: E731
    return {"emails": len(datasets.spam_assassin_emails()), "deduplicated": len(rows),
            "train": {"ham": count(train, "ham"), "spam": count(train, "spam")},
            "test": {"ham": count(test, "ham"), "spam": count(test, "spam")}}


def prepare_pos(out: Path, seed: int, n_train: int, n_test: int) -> dict:
    summary = prepare_data.prepare("brown_pos", str(out), n_train, n_test, seed, overwrite=True)
    return {k: summary[k] for k in ("sentences", "words", "tags")}


def prepare(args) -> None:
    work = Path(args.work_dir)
    summary_path = work / "data.json"
    if summary_path.exists():
        print(f"{summary_path} exists: data already prepared")
        return
    minilm = fetch.fetch_minilm()
    for task in TASKS:
        (work / "data" / task).mkdir(parents=True, exist_ok=True)
    summary = {
        "spam": prepare_spam(work / "data" / "spam", args.seed, 0.2),
        "pos": prepare_pos(work / "data" / "pos", args.seed, args.pos_train_sentences, args.pos_test_sentences),
    }
    # (c) uses MiniLM's architecture with random weights: its config as bert_config.json.
    from bert_keras.checkpoints import read_hf_config

    config = work / "minilm_bert_config.json"
    if not config.exists():
        read_hf_config(str(minilm)).to_json_file(str(config))
    write_text(summary_path, json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


# ------------------------------------------------------------------------------------------
# pretrain (b)


def pretrain_commands(work: Path, vocab: str, steps: int) -> list[list[str]]:
    p = work / "pretrain"
    py = sys.executable
    return [
        [py, "-m", "data_prep.prepare_corpus", f"--input={fetch.fetch_sotu()}", f"--output_file={p / 'sotu.txt'}"],
        [py, "-m", "data_prep.create_pretraining_data", f"--input_file={p / 'sotu.txt'}",
         f"--vocab_file={vocab}", f"--output_file={p / 'data' / 'sotu'}", "--num_output_shards=2",
         "--num_workers=1", "--max_seq_length=64", "--max_predictions_per_seq=10", "--dupe_factor=2",
         "--random_seed=12345"],
        [py, "-m", "bert_keras.run_pretraining", f"--input_file={p / 'data' / 'sotu-*.tfrecord'}",
         "--preset=mini", f"--vocab_file={vocab}", f"--output_dir={p / 'run'}", "--max_seq_length=64",
         "--max_predictions_per_seq=10", "--train_batch_size=32", f"--num_train_steps={steps}",
         f"--num_warmup_steps={steps // 10}", "--learning_rate=5e-4", "--save_checkpoints_steps=500",
         "--seed=12345"],
    ]


def pretrain(args) -> None:
    work = Path(args.work_dir)
    vocab = str(fetch.bert_base_uncased_vocab())
    outputs = [work / "pretrain" / "sotu.txt", work / "pretrain" / "data" / "sotu-00000-of-00002.tfrecord",
               work / "pretrain" / "run" / "encoder"]
    for cmd, output in zip(pretrain_commands(work, vocab, args.pretrain_steps), outputs):
        if output.exists():
            print(f"exists, skipped: {output}")
            continue
        _run(cmd, work / "logs" / f"pretrain-{output.name}.log", work)


# ------------------------------------------------------------------------------------------
# run


def init_flags(work: Path, init: str) -> list[str]:
    minilm = fetch.fetch_minilm()
    if init == "minilm":
        return [f"--init_checkpoint={minilm}", f"--vocab_file={minilm / 'vocab.txt'}"]
    if init == "ours":
        encoder = work / "pretrain" / "run" / "encoder"
        if not encoder.exists():
            raise SystemExit(f"{encoder} missing: run `python bench/finetune_demo.py pretrain` first")
        return [f"--init_checkpoint={encoder}", f"--vocab_file={minilm / 'vocab.txt'}"]
    if init == "random_mini":
        config = work / "mini_bert_config.json"
        if not config.exists():
            from bert_keras.config import BertConfig

            vocab_size = len((minilm / "vocab.txt").read_text(encoding="utf-8").splitlines())
            BertConfig.from_preset("mini", vocab_size=vocab_size).to_json_file(str(config))
        return [f"--bert_config_file={config}", f"--vocab_file={minilm / 'vocab.txt'}"]
    return [f"--bert_config_file={work / 'minilm_bert_config.json'}", f"--vocab_file={minilm / 'vocab.txt'}"]


# Same hyperparameters for every initialisation: the comparison is about the starting point.
TASK_FLAGS = {
    "spam": ["bert_keras.run_classifier", "--max_seq_length=64", "--train_batch_size=32",
             "--learning_rate=1e-4", "--num_train_epochs=2", "--warmup_proportion=0.1"],
    # 64 sub-tokens hold all but ~1% of Brown sentences (truncated words count as errors).
    # 1e-4 left the 190-way tag head underfit (train loss 1.9 after 2 of 3 epochs).
    "pos": ["bert_keras.run_tagger", "--max_seq_length=64", "--train_batch_size=32",
            "--learning_rate=5e-4", "--num_train_epochs=3", "--warmup_proportion=0.1"],
}


def run_command(work: Path, task: str, init: str, seed: int) -> list[str]:
    module, *flags = TASK_FLAGS[task]
    data = work / "data" / task
    files = ({"train_file": data / "train.jsonl", "eval_file": data / "test.jsonl"} if task == "spam"
             else {"train_file": data / "train.conll", "eval_file": data / "test.conll"})
    cmd = [sys.executable, "-m", module, *[f"--{k}={v}" for k, v in files.items()], *flags,
           *init_flags(work, init), "--do_train", "--do_eval", "--jit_compile", f"--seed={seed}",
           f"--output_dir={work / 'runs' / f'{task}-{init}'}"]
    if task == "pos":
        cmd.append(f"--label_list_file={data / 'tags.txt'}")
    return cmd


def _run(cmd: list[str], log: Path, work: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    printable = " ".join(shlex.quote(c) for c in cmd)
    print(f"$ {printable}\n  (log: {log})", flush=True)
    with open(work / "commands.txt", "a", encoding="utf-8") as f:
        f.write(printable + "\n")
    start = time.time()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.run(["nice", "-n", "5", *cmd], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"failed (exit {proc.returncode}) after {time.time() - start:.0f} s; see {log}")
    print(f"  done in {time.time() - start:.0f} s", flush=True)


def run(args) -> None:
    work = Path(args.work_dir)
    if not (work / "data.json").exists():
        raise SystemExit("run `python bench/finetune_demo.py prepare` first")
    for task in args.tasks.split(","):
        for init in args.inits.split(","):
            out = work / "runs" / f"{task}-{init}"
            if (out / "eval_results.json").exists():
                print(f"exists, skipped: {out}")
                continue
            _run(run_command(work, task, init, args.seed), work / "logs" / f"{task}-{init}.log", work)


# ------------------------------------------------------------------------------------------
# table


def table(args) -> None:
    work = Path(args.work_dir)
    rows = ["| task | init | metric | result | train steps | train time |",
            "| --- | --- | --- | --- | --- | --- |"]
    results = {}
    for task in TASKS:
        for init in INITS:
            out = work / "runs" / f"{task}-{init}"
            if not (out / "eval_results.json").exists():
                continue
            ev = json.loads((out / "eval_results.json").read_text())
            tr = json.loads((out / "train_results.json").read_text())
            if task == "spam":
                metric = "accuracy / spam F1"
                value = f"{100 * ev['accuracy']:.2f}% / {100 * ev['per_class']['spam']['f1']:.2f}%"
                n = ev["num_examples"]
            else:
                metric = "token accuracy"
                value = f"{100 * ev['token_accuracy']:.2f}%"
                n = ev["num_words"]
            results[f"{task}-{init}"] = {"eval": ev, "train": {k: v for k, v in tr.items() if k != "loss_history"}}
            rows.append(f"| {task} ({n} test {'emails' if task == 'spam' else 'words'}) | {init} | {metric} | "
                        f"{value} | {tr['num_train_steps']} | {tr['seconds'] / 60:.1f} min |")
    text = "\n".join(rows) + "\n"
    write_text(work / "results.md", text)
    write_text(work / "results.json", json.dumps(results, indent=1) + "\n")
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["prepare", "pretrain", "run", "table"])
    parser.add_argument("--work_dir", default=str(fetch.cache_root() / "finetune-demo"))
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--pos_train_sentences", type=int, default=4000)
    parser.add_argument("--pos_test_sentences", type=int, default=2000)
    parser.add_argument("--pretrain_steps", type=int, default=2000)
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--inits", default=",".join(INITS))
    args = parser.parse_args()
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    {"prepare": prepare, "pretrain": pretrain, "run": run, "table": table}[args.step](args)


if __name__ == "__main__":
    main()
