"""Sentence (pair) regression as a fine-tuning task: STS-B's similarity, a rating.

Reading is `data_prep.classification`'s (TSV/CSV/JSONL by column), or `data_prep.glue`'s
for a `--task_name` (sts-b in GLUE's layout, korsts in KorNLUDatasets', klue-sts in
KLUE's), the label a number; this adapter adds the head (`BertRegressor`: transformers'
BertForSequenceClassification with num_labels=1, trained with mean squared error as
transformers trains it), the scores (Pearson and Spearman correlation, GLUE's STS-B
metrics, and the mean squared error; for klue-sts also KLUE's F1 of "similar", a score of
3.0 or more) and the predictions file (one {"where", "score"} per input row, with the
task's `id` for a --task_name run).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Sequence

import numpy as np
from absl import logging

from bert_keras.finetuning.classification import SentenceTask, accuracy_and_f1
from bert_keras.finetuning.runner import SKIP_PADDING_HELP, Features
from bert_keras.tasks import BertRegressor
from data_prep import classification, files, glue
from data_prep.cli import option

PREDICTIONS_FILE = "predictions.jsonl"
# The largest label magnitude taken. Targets are float32 and so is the mean squared error:
# a label beyond float32 (3.4e38) reads as inf, one above ~1e19 has a squared error that is,
# and either made training's loss inf and its weights NaN, after the whole run. Squares up
# to 1e34 keep a batch's sum (and the gradient's norm) finite for any batch size in use.
MAX_ABS_LABEL = 1e17


@dataclasses.dataclass(frozen=True)
class RegressorOptions:
    task_name: str | None = option(
        None, "sts-b: GLUE's STS-B read from --data_dir as transformers' StsbProcessor reads "
        "it (train.tsv for --do_train, dev.tsv for --do_eval, test.tsv for --do_predict); "
        "korsts: Kakao Brain's Korean STS (sts-train/dev/test.tsv of KorNLUDatasets' KorSTS/); "
        "klue-sts: KLUE's STS (klue-sts-v1.1_train/dev.json; its dev set for --do_predict "
        "too).")
    data_dir: str | None = option(None, "The --task_name's data directory, or the directory "
                                  "the *_file flags are relative to.")
    train_file: str | None = option(None, "Training data (.tsv/.csv with a header row, or "
                                    ".jsonl); the label a number.")
    eval_file: str | None = option(None, "Evaluation data with labels.")
    predict_file: str | None = option(None, "Data to predict (labels optional).")
    text_a_column: str = option("text", "Column / JSON key of the (first) text.")
    text_b_column: str | None = option(None, "Column / JSON key of the second text (pairs).")
    label_column: str = option("label", "Column / JSON key of the number to predict.")
    input_format: str | None = option(None, "File format; default: from the file extension.",
                                      enum=["tsv", "csv", "jsonl"])
    classifier_dropout: float = option(0.1, "Dropout on the pooled output (transformers' "
                                       "name).")
    skip_padding: bool = option(True, SKIP_PADDING_HELP)


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's correlation of two equally long sequences (0 where either is constant, as
    a correlation of nothing)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    x, y = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float(x @ x) * float(y @ y))
    return float(x @ y / denominator) if denominator > 0 else 0.0


def average_ranks(x: Sequence[float]) -> np.ndarray:
    """Ranks 1..N of `x`, tied values sharing the mean of their ranks (scipy's rankdata)."""
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), np.float64)
    sorted_x = x[order]
    start = 0
    for end in range(1, len(x) + 1):
        if end == len(x) or sorted_x[end] != sorted_x[start]:
            ranks[order[start:end]] = (start + 1 + end) / 2  # mean of ranks start+1..end
            start = end
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's of the average ranks (scipy's spearmanr)."""
    return pearson(average_ranks(x), average_ranks(y))


# KLUE-STS's binary label: a pair is "similar" when its mean score is at least 3.0.
KLUE_STS_THRESHOLD = 3.0


def f1_at(gold: Sequence[float], predicted: Sequence[float], threshold: float) -> float:
    """F1 of the scores at or above `threshold` against the gold ones (KLUE-STS's F1, its
    binary-label being real-label >= 3.0); 0 where nothing is, or is predicted, above."""
    similar = [[int(v >= threshold) for v in values] for values in (gold, predicted)]
    scores = accuracy_and_f1(similar[0], similar[1], ["dissimilar", "similar"])
    return scores["per_class"]["similar"]["f1"]


def regression_scores(gold: Sequence[float], predicted: Sequence[float]) -> dict:
    """{"pearson", "spearman", "corr" (their mean, transformers' STS-B "combined score"),
    "mse", "num_examples"}."""
    gold, predicted = np.asarray(gold, np.float64), np.asarray(predicted, np.float64)
    if gold.shape != predicted.shape:
        raise ValueError(f"gold {gold.shape} and predicted {predicted.shape} differ in shape")
    if gold.size == 0:
        raise ValueError("no examples to score")
    p, s = pearson(gold, predicted), spearman(gold, predicted)
    return {"pearson": p, "spearman": s, "corr": (p + s) / 2,
            "mse": float(np.mean((gold - predicted) ** 2)), "num_examples": int(gold.size)}


def _number(example) -> float:
    try:
        value = float(example.label)
    except ValueError:
        raise classification.DataError(f"{example.where}: label {example.label!r} is not a "
                                        "number (a regression target)") from None
    if not math.isfinite(value):
        raise classification.DataError(f"{example.where}: label {example.label!r} is not a "
                                       "finite number")
    if abs(value) > MAX_ABS_LABEL:
        raise classification.DataError(
            f"{example.where}: label {example.label!r} is too large for the float32 mean "
            f"squared error (at most {MAX_ABS_LABEL:g} in magnitude); rescale the labels")
    return value


class RegressionTask(SentenceTask):
    name = "regressor"
    training_flags = ("classifier_dropout", "skip_padding")
    model_class = BertRegressor
    predictions_file = PREDICTIONS_FILE
    uses_labels = False
    regression = True

    def options_class(self):
        return RegressorOptions

    def read(self, path, split, opts):
        examples = super().read(path, split, opts)
        for example in examples:
            if example.label is not None:
                _number(example)  # refused here, before anything is loaded
        return examples

    def build(self, encoder, labels, opts, head_initializer):
        return BertRegressor(encoder, dropout=opts.classifier_dropout,
                             head_initializer=head_initializer, skip_padding=opts.skip_padding)

    def convert(self, examples, tokenizer, labels, common, opts, split):
        arrays, stats = self.packed(examples, tokenizer, None, common)
        del arrays["label_ids"]
        arrays["scores"] = np.asarray([_number(e) if e.label is not None else np.nan
                                       for e in examples], np.float32)
        logging.info("%s: %s", split, stats.summary())
        return Features(arrays, None, stats)

    def targets(self, features):
        return {"score": features.arrays["scores"]}

    def _scores(self, gold, predicted, opts) -> dict:
        scores = regression_scores(gold, predicted)
        if opts.task_name and glue.canonical_task_name(opts.task_name) == "klue-sts":
            scores["f1"] = f1_at(gold, predicted, KLUE_STS_THRESHOLD)  # KLUE's second metric
        return scores

    def evaluate(self, examples, features, outputs, labels, tokenizer, common, opts):
        metrics = self._scores(features.arrays["scores"], outputs["score"], opts)
        metrics["truncated"] = features.stats.truncated
        logging.info("eval: pearson %.4f  spearman %.4f  mse %.4f  (%d examples)",
                     metrics["pearson"], metrics["spearman"], metrics["mse"],
                     metrics["num_examples"])
        return metrics

    def write_predictions(self, examples, features, outputs, labels, tokenizer, common, opts):
        scores = np.asarray(outputs["score"], np.float32)
        records = [{"where": e.where, **({"id": e.id} if e.id is not None else {}),
                    "score": round(float(q), 6)} for e, q in zip(examples, scores)]
        files.write_jsonl(os.path.join(common.output_dir, PREDICTIONS_FILE), records)
        results = {"num_examples": len(records), "truncated": features.stats.truncated}
        if examples and all(e.label is not None for e in examples):
            # Labelled predict data: its scores, as --do_eval gives them for the eval data.
            results.update(self._scores(features.arrays["scores"], scores, opts))
            logging.info("predict: pearson %.4f  spearman %.4f  (%d labelled examples)",
                         results["pearson"], results["spearman"], results["num_examples"])
        return results
