r"""Fine-tunes and runs a BertRegressor: a number per sentence or sentence pair (STS-B).

    python -m bert_keras.run_regressor --task_name=sts-b --data_dir=glue_data/STS-B \
      --init_checkpoint=runs/phase1 --do_train --do_eval --do_predict \
      --max_seq_length=128 --train_batch_size=32 --learning_rate=2e-5 \
      --num_train_epochs=3 --output_dir=out/stsb

    python -m bert_keras.run_regressor --train_file=train.jsonl --text_b_column=text_b \
      --label_column=score --eval_file=dev.jsonl --do_train --do_eval ...

run_classifier's flags and files (TSV/CSV with a header row or JSONL, `data_prep.
classification`), the label a number. transformers' BertForSequenceClassification with
num_labels=1 (problem_type "regression"), trained with mean squared error. Writes to
--output_dir: model.keras, vocab.txt, tokenizer_config.json, bert_config.json (training),
train_results.json, eval_results.json (Pearson and Spearman correlation, their mean
"corr", mse), predictions.jsonl (one {"where", "score"} per row; "id" for --task_name),
predict_results.json.
The task is bert_keras/finetuning/regression.py; the loop bert_keras/finetuning/runner.py.
"""


from bert_keras.finetuning import runner
from bert_keras.finetuning.regression import RegressionTask, RegressorOptions
from data_prep import cli, tokenizer_config

TASK = RegressionTask()
_FLAGS = {**cli.define_flags(runner.FinetuneOptions), **cli.define_flags(RegressorOptions)}
_TOKENIZER_FLAGS = tokenizer_config.define_flags()
# transformers' example scripts' flags (run_glue.py, run_ner.py, run_qa.py) that mean ours.
_TRANSFORMERS_FLAGS = runner.define_transformers_flags(runner.TRANSFORMERS_ALIASES)


def run(**values) -> dict:
    """Runs the tool with flag values as keyword arguments (tests and scripts)."""
    return runner.run(TASK, values)


def main(argv):
    return runner.main(TASK, argv, _FLAGS, _TOKENIZER_FLAGS,
                       transformers_flags=_TRANSFORMERS_FLAGS)


if __name__ == "__main__":
    cli.mark_required(cli.required_flags(runner.FinetuneOptions))
    cli.run(main)
