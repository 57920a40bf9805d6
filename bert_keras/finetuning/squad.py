"""SQuAD-style span question answering as a fine-tuning task, with the official scores.

Reading, windowing and mapping logits back to text are `data_prep.squad`'s (Google's
run_squad.py); this adapter adds the head (`BertSpanQA`), the files Google's tool writes
(predictions.json, nbest_predictions.json, null_odds.json for v2.0) and the official
evaluation (`evaluate`: the v1.1 script, or the v2.0 script with
`version_2_with_negative`): answers normalised by lower-casing, removing punctuation and the
articles a/an/the, and collapsing whitespace; exact match and token F1 take the maximum over
the gold answers; results in percent. --do_eval scores the predictions of --predict_file.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import string
from typing import Mapping, Sequence

from absl import logging

from bert_keras.finetuning.runner import Features, FinetuneError, Task
from bert_keras.tasks import BertSpanQA
from data_prep import files, squad
from data_prep.cli import option


@dataclasses.dataclass(frozen=True)
class SquadOptions:
    train_file: str | None = option(None, "SQuAD JSON for training.")
    predict_file: str | None = option(None, "SQuAD JSON to answer (and score with --do_eval).")
    doc_stride: int | None = option(
        None, "Start of one context window to the next, in WordPieces. Default: 128, or "
        "predicting or evaluating alone, what the model was fine-tuned with.")
    max_query_length: int | None = option(
        None, "Questions are cut to this many WordPieces. Default: 64, or predicting or "
        "evaluating alone, what the model was fine-tuned with.")
    n_best_size: int = option(20, "Candidates kept for start, end and answers.")
    max_answer_length: int | None = option(
        None, "Longest answer, in WordPieces. Default: 30, or predicting or evaluating alone, "
        "what the model was fine-tuned with.")
    version_2_with_negative: bool | None = option(
        None, "SQuAD 2.0: questions may have no answer. Default: false, or predicting or "
        "evaluating alone, what the model was fine-tuned with.")
    null_score_diff_threshold: float | None = option(
        None, "v2.0: answer \"\" if null score - best span score > this. Default: 0, or "
        "predicting or evaluating alone, what the model was fine-tuned with.")


def normalize_answer(s: str) -> str:
    """The official normalisation: lower case, drop punctuation, drop a/an/the, squash spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 if the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str, version_2: bool = False) -> float:
    """Bag-of-tokens F1 of the normalised strings.

    With `version_2` (the v2.0 script) an empty answer scores 1 against an empty answer and 0
    against anything else; the v1.1 script scores 0 whenever nothing overlaps.
    """
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if version_2 and (not pred_tokens or not gold_tokens):
        return float(pred_tokens == gold_tokens)
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def gold_answers(path: str, version_2_with_negative: bool = False) -> dict[str, list[str]]:
    """{qas_id: gold answer texts} from a SQuAD file ([] for a v2.0 unanswerable question)."""
    examples, _ = squad.read_squad(path, is_training=False,
                                   version_2_with_negative=version_2_with_negative)
    return {example.qas_id: list(example.answers) for example in examples}


def evaluate(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
             version_2_with_negative: bool = False) -> dict:
    """Exact match and F1 in percent, each the max over a question's gold answers.

    Args:
      gold: {qas_id: [gold texts]} (from `gold_answers`; [] = unanswerable, v2.0 only).
      predictions: {qas_id: predicted text}. A question without a prediction scores 0 and is
        counted in "missing".
      version_2_with_negative: use the v2.0 script's F1 for empty answers and add the
        HasAns_/NoAns_ breakdown.

    Returns:
      {"exact_match", "f1", "total", "missing"} (+ "HasAns_exact", "HasAns_f1",
      "HasAns_total", "NoAns_exact", "NoAns_f1", "NoAns_total" for v2.0).
    """
    if not gold:
        raise FinetuneError("no gold answers to score against")
    em_scores, f1_scores, missing = {}, {}, 0
    for qas_id, answers in gold.items():
        if version_2_with_negative:
            # The v2.0 script drops answers that normalise to "" and scores an unanswerable
            # question against the empty string.
            answers = [a for a in answers if normalize_answer(a)] or [""]
        elif not answers:
            raise FinetuneError(f"question {qas_id!r} has no gold answer (a v2.0 file? pass "
                                "--version_2_with_negative)")
        if qas_id not in predictions:
            missing += 1
            em_scores[qas_id] = f1_scores[qas_id] = 0.0
            continue
        prediction = predictions[qas_id]
        em_scores[qas_id] = max(exact_match(prediction, a) for a in answers)
        f1_scores[qas_id] = max(f1(prediction, a, version_2_with_negative) for a in answers)

    def block(ids, prefix=""):
        n = len(ids)
        return {f"{prefix}exact": 100.0 * sum(em_scores[q] for q in ids) / n if n else 0.0,
                f"{prefix}f1": 100.0 * sum(f1_scores[q] for q in ids) / n if n else 0.0,
                f"{prefix}total": n}

    everything = block(list(gold))
    result = {"exact_match": everything["exact"], "f1": everything["f1"],
              "total": everything["total"], "missing": missing}
    if version_2_with_negative:
        has = [q for q, a in gold.items() if a]  # the v2.0 script: bool(qa["answers"])
        no = [q for q, a in gold.items() if not a]
        result.update(block(has, "HasAns_"))
        result.update(block(no, "NoAns_"))
    return result


class SquadTask(Task):
    name = "span-QA"
    model_class = BertSpanQA
    uses_labels = False
    default_max_seq_length = 384  # Google's run_squad.py
    # What predicting or evaluating alone takes from the model's fine-tuning (as
    # export_span_qa does), and Google's defaults.
    recorded_options = {"max_query_length": 64, "doc_stride": 128, "max_answer_length": 30,
                        "version_2_with_negative": False, "null_score_diff_threshold": 0.0}

    def options_class(self):
        return SquadOptions

    def input_flag(self, split):
        return "--train_file" if split == "train" else "--predict_file"

    def input_file(self, split, opts):
        return opts.train_file if split == "train" else opts.predict_file

    def validate(self, common, opts):
        if opts.doc_stride < 1:  # parsed as >= 0: run_tagger's 0 truncates
            raise FinetuneError(f"--doc_stride must be >= 1; received {opts.doc_stride}")
        if common.max_seq_length <= opts.max_query_length + 3:
            raise FinetuneError(
                f"--max_seq_length={common.max_seq_length} must exceed --max_query_length="
                f"{opts.max_query_length} + 3 ([CLS] and two [SEP]) to leave room for context")

    def output_files(self, common, opts):
        answering = common.do_predict or common.do_eval
        return ([files.TASK_MODEL_FILE, files.TRAIN_RESULTS_FILE] if common.do_train else []) + \
            (["predictions.json", "nbest_predictions.json"] if answering else []) + \
            (["null_odds.json"] if answering and opts.version_2_with_negative else []) + \
            (["eval_results.json"] if common.do_eval else []) + \
            (["predict_results.json"] if common.do_predict else [])

    def result_files(self, common, opts):
        # A SQuAD 2.0 run's null odds, whatever this run's --version_2_with_negative.
        return super().result_files(common, opts) + ["null_odds.json"]

    def read(self, path, split, opts):
        examples, stats = squad.read_squad(path, split == "train", opts.version_2_with_negative)
        logging.info("%s: %s", split, stats.summary())
        if split == "eval" and not opts.version_2_with_negative:
            # Checked with the inputs, before anything is trained or written.
            unanswered = next((e for e in examples if not e.answers), None)
            if unanswered is not None:
                raise FinetuneError(
                    f"{path}: question {unanswered.qas_id!r} has no gold answer, and "
                    "--do_eval scores answers (a SQuAD 2.0 file? pass "
                    "--version_2_with_negative; to answer without scoring, --do_predict alone)")
        return (examples, stats) if split == "train" else examples

    def build(self, encoder, labels, opts, head_initializer):
        return BertSpanQA(encoder, head_initializer=head_initializer)

    def convert(self, examples, tokenizer, labels, common, opts, split):
        arrays, windows, stats = squad.convert_examples(
            examples, tokenizer, common.max_seq_length, opts.doc_stride, opts.max_query_length,
            split == "train")
        logging.info("%s: %s", split, stats.summary())
        return Features(arrays, windows, stats)

    def targets(self, features):
        return {"start_logits": features.arrays["start_positions"],
                "end_logits": features.arrays["end_positions"]}

    def train_summary(self, features, read_info):
        return {"questions": read_info.questions,
                "answers_not_found": [list(x) for x in read_info.answers_not_found],
                "windows": features.stats.features,
                "questions_truncated": features.stats.questions_truncated}

    def export_settings(self, opts):
        return {"max_query_length": opts.max_query_length, "doc_stride": opts.doc_stride,
                "max_answer_length": opts.max_answer_length,
                "null_score_diff_threshold": opts.null_score_diff_threshold,
                "version_2_with_negative": opts.version_2_with_negative}

    def _answer(self, examples, features, outputs, tokenizer, common, opts):
        predictions, nbest, null_odds = squad.postprocess(
            examples, features.extra, outputs["start_logits"], outputs["end_logits"],
            opts.n_best_size, opts.max_answer_length, tokenizer.config,
            opts.version_2_with_negative, opts.null_score_diff_threshold)
        out = common.output_dir
        files.write_json(os.path.join(out, "predictions.json"), predictions)
        files.write_json(os.path.join(out, "nbest_predictions.json"), nbest)
        if opts.version_2_with_negative:
            files.write_json(os.path.join(out, "null_odds.json"), null_odds)
        return predictions

    def evaluate(self, examples, features, outputs, labels, tokenizer, common, opts):
        predictions = self._answer(examples, features, outputs, tokenizer, common, opts)
        gold = {e.qas_id: list(e.answers) for e in examples}
        metrics = evaluate(gold, predictions, opts.version_2_with_negative)
        logging.info("eval: EM %.2f  F1 %.2f  (%d questions)", metrics["exact_match"],
                     metrics["f1"], metrics["total"])
        return metrics

    def write_predictions(self, examples, features, outputs, labels, tokenizer, common, opts):
        self._answer(examples, features, outputs, tokenizer, common, opts)
        return {"questions": len(examples), "windows": features.stats.features}
