"""Fine-tunes and runs a BertSpanQA model on SQuAD v1.1 / v2.0 JSON files.

    python -m bert_keras.run_squad \
      --train_file=train-v1.1.json --predict_file=dev-v1.1.json \
      --vocab_file=vocab.txt --init_checkpoint=/path/to/checkpoint \
      --do_train --do_predict --max_seq_length=384 --doc_stride=128 --output_dir=out/

Google's flags and semantics (run_squad.py): windows of --max_seq_length with --doc_stride,
questions cut to --max_query_length, --n_best_size candidates, answers of at most
--max_answer_length WordPieces; --version_2_with_negative for SQuAD 2.0 with
--null_score_diff_threshold. --do_predict writes predictions.json and nbest_predictions.json
(and null_odds.json for v2.0); when the predict file has answers, --do_eval also scores them
with the official EM/F1 into eval_results.json.
"""

from __future__ import annotations

import os

import keras
from absl import app, flags, logging

from bert_keras import finetune
from bert_keras.tasks import BertSpanQA
from data_prep import squad
from data_prep.packing import model_inputs

_SHARED = finetune.SHARED_FLAG_ARGS  # see finetune.py: names shared with other tools

_COMMON = finetune.define_common_flags(max_seq_length=384, learning_rate=3e-5, num_train_epochs=2.0,
                                       train_batch_size=12)
_TRAIN_FILE = flags.DEFINE_string("train_file", None, "SQuAD JSON for training.", **_SHARED)
_PREDICT_FILE = flags.DEFINE_string("predict_file", None, "SQuAD JSON to answer (and score with --do_eval).", **_SHARED)
_DOC_STRIDE = flags.DEFINE_integer("doc_stride", 128, "Start of one context window to the next, in WordPieces.", **_SHARED)
_MAX_QUERY_LENGTH = flags.DEFINE_integer("max_query_length", 64, "Questions are cut to this many WordPieces.", **_SHARED)
_N_BEST_SIZE = flags.DEFINE_integer("n_best_size", 20, "Candidates kept for start, end and answers.", **_SHARED)
_MAX_ANSWER_LENGTH = flags.DEFINE_integer("max_answer_length", 30, "Longest answer, in WordPieces.", **_SHARED)
_VERSION_2 = flags.DEFINE_boolean("version_2_with_negative", False, "SQuAD 2.0: questions may have no answer.", **_SHARED)
_NULL_THRESHOLD = flags.DEFINE_float("null_score_diff_threshold", 0.0,
                                     "v2.0: answer \"\" if null score - best span score > this.", **_SHARED)


def run(train_file=None, predict_file=None, doc_stride=128, max_query_length=64, n_best_size=20,
        max_answer_length=30, version_2_with_negative=False, null_score_diff_threshold=0.0,
        **common):
    """Train / predict / eval; returns {"train", "predict", "eval"} summaries.

    Args:
      **common: the values of `finetune.define_common_flags`.
    """
    c = common
    if not (c["do_train"] or c["do_predict"] or c["do_eval"]):
        raise ValueError("nothing to do: set at least one of --do_train, --do_predict, --do_eval")
    if c["do_train"] and not train_file:
        raise ValueError("--train_file is required with --do_train")
    if (c["do_predict"] or c["do_eval"]) and not predict_file:
        raise ValueError("--predict_file is required with --do_predict / --do_eval")
    outputs = (["model.keras", "train_results.json"] if c["do_train"] else []) + \
        (["predictions.json", "nbest_predictions.json"] if c["do_predict"] or c["do_eval"] else []) + \
        (["null_odds.json"] if version_2_with_negative and (c["do_predict"] or c["do_eval"]) else []) + \
        (["eval_results.json"] if c["do_eval"] else [])
    finetune.prepare_output_dir(c["output_dir"], outputs, c["overwrite_output"])
    keras.utils.set_random_seed(c["seed"])
    vocab_file = finetune.resolve_vocab(c["vocab_file"], c["init_checkpoint"], c["output_dir"], c["do_train"])
    tokenizer = finetune.make_tokenizer(vocab_file, c["do_lower_case"])
    model, _ = finetune.task_model(BertSpanQA, c["init_checkpoint"], c["bert_config_file"],
                                   c["output_dir"], c["do_train"], BertSpanQA)
    finetune.check_vocab(model.encoder, vocab_file)
    finetune.check_seq_length(model.encoder, c["max_seq_length"])
    results = {}

    def windows(examples, is_training, what):
        arrays, features, stats = squad.convert_examples(
            examples, tokenizer, c["max_seq_length"], doc_stride, max_query_length, is_training)
        logging.info("%s: %s", what, stats.summary())
        return arrays, features, stats

    # Read and convert every input before training: a bad file fails in seconds.
    if c["do_train"]:
        train_examples, train_read = squad.read_squad(train_file, True, version_2_with_negative)
        logging.info("train: %s", train_read.summary())
        train_arrays, _, train_stats = windows(train_examples, True, "train")
    if c["do_predict"] or c["do_eval"]:
        examples, _ = squad.read_squad(predict_file, False, version_2_with_negative)
        arrays, features, stats = windows(examples, False, "predict")
        gold = squad.gold_answers(predict_file, version_2_with_negative) if c["do_eval"] else None

    if c["do_train"]:
        y = {"start_logits": train_arrays["start_positions"], "end_logits": train_arrays["end_positions"]}
        summary = finetune.train(model, model_inputs(train_arrays), y, c["train_batch_size"],
                                 c["num_train_epochs"], c["learning_rate"], c["warmup_proportion"],
                                 seed=c["seed"], jit_compile=c["jit_compile"])
        summary.update(questions=train_read.questions,
                       answers_not_found=[list(x) for x in train_read.answers_not_found],
                       windows=train_stats.features, questions_truncated=train_stats.questions_truncated)
        finetune.save_task_model(model, c["output_dir"], None, vocab_file, c["overwrite_output"])
        finetune.write_json(os.path.join(c["output_dir"], "train_results.json"), summary)
        results["train"] = summary

    if c["do_predict"] or c["do_eval"]:
        logits = finetune.predict(model, model_inputs(arrays), c["eval_batch_size"])
        predictions, nbest, null_odds = squad.postprocess(
            examples, features, logits["start_logits"], logits["end_logits"], n_best_size,
            max_answer_length, tokenizer.do_lower_case, version_2_with_negative,
            null_score_diff_threshold)
        out = c["output_dir"]
        finetune.write_json(os.path.join(out, "predictions.json"), predictions)
        finetune.write_json(os.path.join(out, "nbest_predictions.json"), nbest)
        if version_2_with_negative:
            finetune.write_json(os.path.join(out, "null_odds.json"), null_odds)
        results["predict"] = {"questions": len(examples), "windows": stats.features}
        if c["do_eval"]:
            metrics = squad.evaluate(gold, predictions, version_2_with_negative)
            finetune.write_json(os.path.join(out, "eval_results.json"), metrics)
            logging.info("eval: EM %.2f  F1 %.2f  (%d questions)", metrics["exact_match"],
                         metrics["f1"], metrics["total"])
            results["eval"] = metrics
    return results


def main(argv):
    del argv
    run(train_file=_TRAIN_FILE.value, predict_file=_PREDICT_FILE.value, doc_stride=_DOC_STRIDE.value,
        max_query_length=_MAX_QUERY_LENGTH.value, n_best_size=_N_BEST_SIZE.value,
        max_answer_length=_MAX_ANSWER_LENGTH.value, version_2_with_negative=_VERSION_2.value,
        null_score_diff_threshold=_NULL_THRESHOLD.value, **finetune.common_values(_COMMON))


if __name__ == "__main__":
    flags.mark_flag_as_required("output_dir")
    app.run(main)
