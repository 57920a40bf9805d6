r"""Fine-tunes and runs a BertClassifier on sentence or sentence-pair classification data.

    python -m bert_keras.run_classifier \
      --train_file=train.jsonl --eval_file=test.jsonl --predict_file=test.jsonl \
      --init_checkpoint=runs/phase1 --do_train --do_eval --do_predict \
      --max_seq_length=128 --output_dir=out/

Input files are TSV/CSV (with a header row) or JSONL; see `data_prep.classification`.
Writes to --output_dir: model.keras, labels.txt, vocab.txt, tokenizer_config.json,
bert_config.json (training), train_results.json, eval_results.json (accuracy, macro F1,
per-class P/R/F1), predictions.jsonl (one {"where", "label", "probabilities"} per row),
predict_results.json (counts, seconds, examples/s).
The task is bert_keras/finetuning/classification.py; the loop bert_keras/finetuning/runner.py.
"""


from bert_keras.finetuning import runner
from bert_keras.finetuning.classification import ClassificationTask, ClassifierOptions
from data_prep import cli, tokenizer_config

TASK = ClassificationTask()
_FLAGS = {**cli.define_flags(runner.FinetuneOptions), **cli.define_flags(ClassifierOptions)}
_TOKENIZER_FLAGS = tokenizer_config.define_flags()
# transformers' example scripts' flags (run_glue.py, run_ner.py, run_qa.py) that mean ours.
_TRANSFORMERS_FLAGS = runner.define_transformers_flags(runner.TRANSFORMERS_ALIASES)
# Google's run_classifier.py flags that name no option here (its README's commands run as written).
_GOOGLE_FLAGS = runner.define_googles_flags()


def run(**values) -> dict:
    """Runs the tool with flag values as keyword arguments (tests and scripts)."""
    return runner.run(TASK, values)


def main(argv):
    return runner.main(TASK, argv, _FLAGS, _TOKENIZER_FLAGS, _GOOGLE_FLAGS,
                       _TRANSFORMERS_FLAGS)


if __name__ == "__main__":
    cli.mark_required(cli.required_flags(runner.FinetuneOptions))
    cli.run(main)
