r"""Fine-tunes and runs a BertTagger on CoNLL-style token tagging data (NER, POS).

    python -m bert_keras.run_tagger \
      --train_file=train.conll --eval_file=test.conll --predict_file=test.conll \
      --init_checkpoint=runs/phase1 --do_train --do_eval --do_predict \
      --max_seq_length=128 --output_dir=out/

Input: one "word ... tag" line per token, blank line between sentences (see
`data_prep.tagging`), or transformers' run_ner.py JSON lines (.json/.jsonl: words and tags
under --text_column_name / --label_column_name; tag ids named by --label_list_file). Each
word's tag is learned and predicted on its first WordPiece. A sentence longer than
--max_seq_length - 2 WordPieces is read in windows --doc_stride WordPieces apart (default:
half a window; 0 truncates instead), each word tagged from the window that gives it the most
context, so every word gets a prediction (docs/finetuning.md).
Writes to --output_dir: model.keras, labels.txt, vocab.txt, tokenizer_config.json,
bert_config.json (training), train_results.json, eval_results.json (token accuracy and
seqeval-style entity precision/recall/F1), predictions.conll ("word predicted_tag" lines),
predict_results.json (counts, seconds, examples/s).

KLUE-NER (character tags): --task_name=klue-ner --data_dir=klue_benchmark reads KLUE's
klue-ner-v1.1 files; --tag_format=klue reads other files in that format through the
*_file flags. Each sentence is tokenized whole and every WordPiece tagged with its first
character's tag; predictions.tsv is in KLUE's format and eval_results.json has KLUE's
entity and character macro F1 (`data_prep.klue_ner`).
The task is bert_keras/finetuning/tagging.py; the loop bert_keras/finetuning/runner.py.
"""


from bert_keras.finetuning import runner
from bert_keras.finetuning.tagging import TaggerOptions, TaggingTask
from data_prep import cli, tokenizer_config

TASK = TaggingTask()
_FLAGS = {**cli.define_flags(runner.FinetuneOptions), **cli.define_flags(TaggerOptions)}
_TOKENIZER_FLAGS = tokenizer_config.define_flags()
# transformers' example scripts' flags (run_glue.py, run_ner.py, run_qa.py) that mean ours.
_TRANSFORMERS_FLAGS = runner.define_transformers_flags(runner.TAGGER_TRANSFORMERS_ALIASES)


def run(**values) -> dict:
    """Runs the tool with flag values as keyword arguments (tests and scripts)."""
    return runner.run(TASK, values)


def main(argv):
    return runner.main(TASK, argv, _FLAGS, _TOKENIZER_FLAGS,
                       transformers_flags=_TRANSFORMERS_FLAGS)


if __name__ == "__main__":
    cli.mark_required(cli.required_flags(runner.FinetuneOptions))
    cli.run(main)
