r"""Fine-tunes and runs a BertSpanQA model on SQuAD v1.1 / v2.0 JSON files.

    python -m bert_keras.run_squad \
      --train_file=train-v1.1.json --predict_file=dev-v1.1.json \
      --init_checkpoint=runs/phase1 --do_train --do_predict --do_eval \
      --max_seq_length=384 --doc_stride=128 --output_dir=out/

Input: SQuAD's JSON, or transformers' run_qa.py data (one question per object, as JSON lines
or under {"data": [...]}). Google's flags and semantics (run_squad.py): windows of
--max_seq_length with --doc_stride, questions cut to --max_query_length, --n_best_size
candidates, answers of at most --max_answer_length WordPieces; --version_2_with_negative for
SQuAD 2.0 with --null_score_diff_threshold. --do_predict writes predictions.json and
nbest_predictions.json (and null_odds.json for v2.0); when the predict file has answers,
--do_eval also scores them with the official EM/F1 into eval_results.json;
predict_results.json has counts and timing.
Korean benchmarks: --task_name=korquad (KorQuAD 1.0, F1 over characters) or klue-mrc
(SQuAD 2.0's layout, KLUE's EM and ROUGE-W) reads the files from --data_dir;
--eval_metric scores other files so.
The task is bert_keras/finetuning/squad.py; the loop bert_keras/finetuning/runner.py.
"""


from bert_keras.finetuning import runner
from bert_keras.finetuning.squad import SquadOptions, SquadTask
from data_prep import cli, tokenizer_config

TASK = SquadTask()
# The hyperparameters of Google's README SQuAD command (its script's flag defaults are 32,
# 5e-5 and 3.0; docs/finetuning.md says so); its windows: SquadTask.default_max_seq_length.
_DEFAULTS = {"learning_rate": 3e-5, "num_train_epochs": 2.0, "train_batch_size": 12}
_FLAGS = {**cli.define_flags(runner.FinetuneOptions, _DEFAULTS), **cli.define_flags(SquadOptions)}
_TOKENIZER_FLAGS = tokenizer_config.define_flags()
# transformers' example scripts' flags (run_glue.py, run_ner.py, run_qa.py) that mean ours.
_TRANSFORMERS_FLAGS = runner.define_transformers_flags(runner.SQUAD_TRANSFORMERS_ALIASES)
# Google's run_squad.py flags that name no option here (its README's commands run as written).
_GOOGLE_FLAGS = runner.define_googles_flags(
    (*runner.FINETUNING_GOOGLE_FLAGS, "verbose_logging"))


def run(**values) -> dict:
    """Runs the tool with flag values as keyword arguments (tests and scripts)."""
    return runner.run(TASK, {**_DEFAULTS, **values})


def main(argv):
    return runner.main(TASK, argv, _FLAGS, _TOKENIZER_FLAGS, _GOOGLE_FLAGS,
                       _TRANSFORMERS_FLAGS)


if __name__ == "__main__":
    cli.mark_required(cli.required_flags(runner.FinetuneOptions))
    cli.run(main)
