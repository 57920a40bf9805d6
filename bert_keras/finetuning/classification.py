"""Sentence (pair) classification as a fine-tuning task: TSV/CSV/JSONL in, labels out.

Reading and conversion are `data_prep.classification`'s; this adapter adds the head
(`BertClassifier`), the scores (accuracy, macro F1, per-class precision/recall/F1) and the
predictions file (one {"where", "label", "probabilities"} per input row).

A GLUE / XNLI run (`--task_name`) also writes Google's run_classifier.py files beside ours,
which GLUE submission scripts read: `eval_results.txt` (`key = value` lines, keys sorted:
eval_accuracy, eval_loss, global_step, loss) and `test_results.tsv` (one line per example
of the task's test file, in input order: the class probabilities in label-list order,
tab-separated, no header).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

import numpy as np
from absl import logging

from bert_keras.finetuning.runner import (SKIP_PADDING_HELP, Features, FinetuneError,
                                          LabelledFileTask, evaluated_model_dir,
                                          labels_from_flags, trained_steps)
from bert_keras.tasks import BertClassifier
from data_prep import classification, files, packing
from data_prep.cli import option

PREDICTIONS_FILE = "predictions.jsonl"
# Google's run_classifier.py outputs, written for --task_name runs.
GOOGLE_EVAL_FILE = "eval_results.txt"
GOOGLE_TEST_FILE = "test_results.tsv"


# Google's flags select a split of a --task_name's --data_dir like this.
_GLUE_SPLIT = {"train": "train", "eval": "dev", "predict": "test"}
# --xnli_language's default: Google's run_classifier.py hard-codes it.
XNLI_LANGUAGE = "zh"
# The flags that name a classifier's labels in id order: run_classifier's, and
# convert_checkpoint's for a checkpoint that records none (Google's run_classifier, a
# keras-hub BertTextClassifier).
LABEL_FLAGS = ("task_name", "label_list", "label_list_file")
# Flags of the *_file route that a --task_name fixes itself.
_FILE_ROUTE_FLAGS = ("text_a_column", "text_b_column", "label_column", "input_format",
                     "label_list", "label_list_file")


@dataclasses.dataclass(frozen=True)
class ClassifierOptions:
    task_name: str | None = option(
        None, "A GLUE / XNLI task read from --data_dir as Google's run_classifier.py reads it: "
        "cola, sst-2, mrpc, qqp, mnli, mnli-mm, qnli, rte, wnli, xnli (train.tsv for "
        "--do_train, the dev file for --do_eval, the test file for --do_predict); kornli: "
        "Kakao Brain's Korean NLI (KorNLUDatasets' KorNLI/: both translated training sets, "
        "XNLI's Korean dev and test sets); klue-nli, klue-ynat (ynat), klue-re: KLUE's NLI, "
        "topic classification and relation extraction (<task>-v1.1_train/dev.json; the dev "
        "set for --do_predict too; klue-re's entities marked in the text); nsmc: "
        "Naver's movie-review sentiment (ratings_train.txt; ratings_test.txt for --do_eval "
        "and --do_predict).")
    xnli_language: str = option(XNLI_LANGUAGE, "--task_name=xnli: the language of the train "
                                "file and of the dev/test rows (Google's script hard-codes zh).")
    data_dir: str | None = option(None, "The --task_name's data directory, or the directory "
                                  "the *_file flags are relative to.")
    train_file: str | None = option(None, "Training data (.tsv/.csv with a header row, or .jsonl).")
    eval_file: str | None = option(None, "Labelled evaluation data.")
    predict_file: str | None = option(None, "Data to predict (labels optional).")
    text_a_column: str = option("text", "Column / JSON key of the (first) text.")
    text_b_column: str | None = option(None, "Column / JSON key of the second text (pairs).")
    label_column: str = option("label", "Column / JSON key of the label.")
    input_format: str | None = option(None, "File format; default: from the file extension.",
                                      enum=["tsv", "csv", "jsonl"])
    label_list: list | None = option(None, "Labels in id order; default: the sorted labels of "
                                     "--train_file (by value if all are integers), or "
                                     "labels.txt of the model.")
    label_list_file: str | None = option(None, "Labels in id order, one a line.")
    classifier_dropout: float = option(0.1, "Dropout on the pooled output.")
    skip_padding: bool = option(True, SKIP_PADDING_HELP)
    allow_single_class: bool = option(False, "Accept a --train_file whose examples all have "
                                      "one label (otherwise an error: such a model always "
                                      "predicts that label).")


def _scores(labels: Sequence[str]) -> bool:
    """Whether every label is a number and some are written with a fraction or exponent
    (3.8, 1.0, 2e-1): a float column, as `datasets` types it."""
    try:
        values = [float(label) for label in labels]
    except ValueError:
        return False
    return all(np.isfinite(values)) and any(
        not label.lstrip("+-").isdigit() for label in labels)


def accuracy_and_f1(label_ids: Sequence[int], predicted_ids: Sequence[int],
                    label_list: Sequence[str]) -> dict:
    """Accuracy, macro-averaged F1 and per-class precision/recall/F1.

    Args:
      label_ids: int gold label ids [N].
      predicted_ids: int predicted label ids [N].
      label_list: label names in id order.

    Returns:
      {"accuracy", "macro_f1", "mcc", "num_examples", "per_class": {label: {"precision",
      "recall", "f1", "support"}}}; a class with no predictions (or no gold) has precision
      (recall) 0. "mcc" is Matthews' correlation coefficient (Gorodkin's multi-class form;
      CoLA's GLUE metric, transformers' `glue_compute_metrics("cola")`), 0 where every
      example has one gold or one predicted class.
    """
    gold = np.asarray(label_ids)
    pred = np.asarray(predicted_ids)
    if gold.shape != pred.shape:
        raise ValueError(f"label_ids {gold.shape} and predicted_ids {pred.shape} differ in shape")
    if gold.size == 0:
        raise ValueError("no examples to score")
    per_class = {}
    for i, name in enumerate(label_list):
        tp = int(np.sum((pred == i) & (gold == i)))
        fp = int(np.sum((pred == i) & (gold != i)))
        fn = int(np.sum((pred != i) & (gold == i)))
        p = tp / (tp + fp) if tp + fp else 0.0
        r = tp / (tp + fn) if tp + fn else 0.0
        f = 2 * p * r / (p + r) if p + r else 0.0
        per_class[name] = {"precision": p, "recall": r, "f1": f, "support": tp + fn}
    return {
        "accuracy": float(np.mean(gold == pred)),
        "macro_f1": float(np.mean([c["f1"] for c in per_class.values()])),
        "mcc": matthews_correlation(gold, pred, len(label_list)),
        "num_examples": int(gold.size),
        "per_class": per_class,
    }


def matthews_correlation(gold: np.ndarray, pred: np.ndarray, num_classes: int) -> float:
    """Matthews' correlation coefficient of int label ids (multi-class, Gorodkin 2004):
    (c s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2) (s^2 - sum_k t_k^2)), with c the
    correct count, s the total, t_k and p_k the gold and predicted counts of class k; 0
    where a factor of the denominator is 0, as scikit-learn returns."""
    gold, pred = np.asarray(gold, np.int64), np.asarray(pred, np.int64)
    t = np.bincount(gold, minlength=num_classes).astype(np.float64)
    p = np.bincount(pred, minlength=num_classes).astype(np.float64)
    s, c = float(gold.size), float(np.sum(gold == pred))
    denominator = (s * s - p @ p) * (s * s - t @ t)
    return float((c * s - p @ t) / np.sqrt(denominator)) if denominator > 0 else 0.0


def relation_micro_f1(label_ids: Sequence[int], predicted_ids: Sequence[int],
                      none_id: int) -> float:
    """KLUE-RE's micro F1: true positives, false positives and false negatives summed over
    every class but `none_id` ("no_relation"), as scikit-learn's f1_score(average="micro",
    labels=the others) counts them: a relation predicted as no_relation is a false negative,
    no_relation predicted as a relation a false positive."""
    gold, pred = np.asarray(label_ids), np.asarray(predicted_ids)
    tp = int(np.sum((gold == pred) & (gold != none_id)))
    predicted = int(np.sum(pred != none_id))
    actual = int(np.sum(gold != none_id))
    return 2 * tp / (predicted + actual) if predicted + actual else 0.0


def average_precision_area(label_ids: Sequence[int], probabilities: np.ndarray) -> float:
    """KLUE-RE's AUPRC: for each class, the area under its precision-recall curve (the
    trapezoids between the points of every distinct score, scikit-learn's
    precision_recall_curve and auc), averaged over the classes. A class absent from the
    gold labels has recall 1 at every threshold, as scikit-learn sets it, and precision 0:
    its area is the last trapezoid's, from (1, 0) to (0, 1), 0.5."""
    gold = np.asarray(label_ids)
    probabilities = np.asarray(probabilities, np.float64)
    areas = []
    for c in range(probabilities.shape[1]):
        target = (gold == c).astype(np.float64)
        order = np.argsort(probabilities[:, c], kind="mergesort")[::-1]
        scores, target = probabilities[order, c], target[order]
        # The last index of each run of equal scores: one point per distinct threshold.
        last = np.r_[np.where(np.diff(scores))[0], scores.size - 1]
        tps = np.cumsum(target)[last]
        fps = 1 + last - tps
        precision = tps / (tps + fps)
        recall = tps / tps[-1] if tps[-1] else np.ones_like(tps)
        # From the highest threshold down, with the (recall 0, precision 1) end point.
        recall = np.r_[0.0, recall]
        precision = np.r_[1.0, precision]
        areas.append(float(np.sum(np.diff(recall) * (precision[1:] + precision[:-1]) / 2)))
    return float(np.mean(areas))


def _warn_of_unknown_markers(tokenizer, split: str) -> None:
    """KLUE-RE: says when the vocabulary lacks characters of the entity markers (before,
    the markers silently became [UNK], counted only among the split's [UNK] tokens)."""
    from data_prep import glue

    missing = glue.relation_markers_not_in_vocabulary(tokenizer)
    if missing:
        logging.warning(
            "%s: the vocabulary has no token for %s of KLUE-RE's entity markers "
            "(@*TYPE*...@, #^TYPE^...#): each becomes [UNK] in every example, and markers "
            "that differ by them look alike to the model. Use a vocabulary that has them "
            "(Google's have every ASCII punctuation character; data_prep.build_vocab keeps "
            "the characters of its corpus: learn it from text that holds them)", split,
            ", ".join(repr(c) for c in missing))


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def mean_cross_entropy(logits: np.ndarray, label_ids: Sequence[int]) -> float:
    """Mean softmax cross-entropy of float logits [N, C] against int label ids [N]."""
    logits = np.asarray(logits, np.float64)
    z = logits - logits.max(-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-np.mean(log_probs[np.arange(len(log_probs)), np.asarray(label_ids)]))


def google_eval_text(results: dict) -> str:
    """Google's eval_results.txt: `key = value` per line, keys sorted (its `str(value)`)."""
    return "".join(f"{key} = {str(results[key])}\n" for key in sorted(results))


def google_test_text(probabilities: np.ndarray) -> str:
    """Google's test_results.tsv: one line per example, its class probabilities (float32,
    shortest repr) tab-separated."""
    return "".join("\t".join(str(np.float32(q)) for q in row) + "\n"
                   for row in np.asarray(probabilities, np.float32))


class SentenceTask(LabelledFileTask):
    """A task on a text or a pair of texts per example, read from --{train,eval,predict}_file
    (TSV/CSV/JSONL columns) or from a GLUE --task_name's --data_dir: classification, and
    regression (`bert_keras.finetuning.regression`)."""

    regression = False  # whether the label is a number (its tool takes regression tasks)

    def input_flag(self, split):
        return f"--{split}_file (or --task_name with --data_dir)"

    def validate(self, common, opts):
        super().validate(common, opts)
        # Evaluating or predicting alone, a model fine-tuned on pairs reads the second texts
        # too: without them it would score other inputs than it was trained on.
        if common.do_train or opts.task_name or opts.text_b_column is not None:
            return
        model_dir = evaluated_model_dir(common)
        recorded = files.fine_tuned_with(model_dir) if model_dir else {}
        if recorded.get("text_pair") is True:
            raise FinetuneError(
                f"--text_b_column: {model_dir} was fine-tuned on sentence pairs "
                f"({files.TRAIN_RESULTS_FILE}: text_pair); name the column of the second "
                "text, as its training did")
        if (model_dir and not recorded  # a converted model: its pairs are not known
                and os.path.isfile(os.path.join(model_dir, files.TASK_MODEL_FILE))):
            logging.warning("%s: its inputs are read as single texts; give --text_b_column "
                            "if it was fine-tuned on sentence pairs",
                            files.records_no_fine_tuning(model_dir))

    def packed(self, examples, tokenizer, labels, common):
        """`classification.convert_examples` of `examples`, once --max_seq_length is known to
        hold [CLS], [SEP] and a WordPiece of each text (a pair's second [SEP] too)."""
        pair = next((e for e in examples if e.text_b is not None), None)
        if common.max_seq_length < packing.least_length(pair is not None):
            raise FinetuneError(
                f"--max_seq_length={common.max_seq_length} is too short: "
                + ("a text needs at least 3 positions ([CLS], [SEP] and a WordPiece)"
                   if pair is None else f"{pair.where} is a pair, which needs at least 4 "
                   "positions ([CLS], [SEP], [SEP] and a WordPiece of each text)"))
        return classification.convert_examples(examples, tokenizer, labels,
                                               common.max_seq_length)

    def input_file(self, split, opts):
        if opts.task_name:
            if not opts.data_dir:
                raise FinetuneError("--task_name needs --data_dir (the task's directory of "
                                    "the GLUE download)")
            return self._processor(opts).path(opts.data_dir, _GLUE_SPLIT[split])
        return super().input_file(split, opts)

    def _processor(self, opts):
        from data_prep import glue

        if any(getattr(opts, f"{s}_file") for s in _GLUE_SPLIT):
            raise FinetuneError("--task_name reads its files from --data_dir; drop "
                                "--train_file / --eval_file / --predict_file")
        given = [f"--{f.name}" for f in dataclasses.fields(opts)
                 if f.name in _FILE_ROUTE_FLAGS and getattr(opts, f.name) != f.default]
        if given:  # Each would be silently ignored: the task fixes columns and labels.
            raise FinetuneError(f"--task_name reads its columns and labels as the task's "
                                f"GLUE processor does; drop {' / '.join(given)}")
        processor = glue.get_processor(
            opts.task_name, language=getattr(opts, "xnli_language", XNLI_LANGUAGE))
        if processor.is_regression() != self.regression:
            tool, kind = (("run_regressor", "a regression task (a number per example, not a "
                           "class)") if processor.is_regression()
                          else ("run_classifier", "a classification task"))
            raise FinetuneError(f"--task_name={opts.task_name}: {kind}; run "
                                f"bert_keras.{tool} with the same flags")
        return processor

    def read(self, path, split, opts):
        if opts.task_name:
            loaded = self._processor(opts).load(opts.data_dir, _GLUE_SPLIT[split])
            logging.info("%s", loaded.summary())
            # Each example with the id the GLUE server expects, for the predictions file.
            return [dataclasses.replace(e, id=i) for e, i in zip(loaded.examples, loaded.ids)]
        return classification.read_examples(
            path, opts.text_a_column, opts.text_b_column, opts.label_column,
            fmt=opts.input_format, require_label=split != "predict")

    def train_summary(self, features, read_info):
        # text_pair: what the export's serve_examples parses by default.
        return {"truncated": features.stats.truncated, "text_pair": features.stats.pairs > 0}


class ClassificationTask(SentenceTask):
    name = "classifier"
    training_flags = ("classifier_dropout", "skip_padding")
    model_class = BertClassifier
    predictions_file = PREDICTIONS_FILE

    def options_class(self):
        return ClassifierOptions

    def output_files(self, common, opts):
        google = (([GOOGLE_EVAL_FILE] if common.do_eval else []) +
                  ([GOOGLE_TEST_FILE] if common.do_predict else [])) if opts.task_name else []
        return super().output_files(common, opts) + google

    def result_files(self, common, opts):
        # Google's files of a --task_name run, whatever this run's route.
        return super().result_files(common, opts) + [GOOGLE_EVAL_FILE, GOOGLE_TEST_FILE]

    def input_file(self, split, opts):
        if opts.xnli_language != XNLI_LANGUAGE and (opts.task_name or "").lower() != "xnli":
            raise FinetuneError(f"--xnli_language={opts.xnli_language} is for "
                                "--task_name=xnli; drop it (it would be ignored)")
        return super().input_file(split, opts)

    def given_labels(self, opts):
        if opts.task_name:
            return self._processor(opts).labels()
        return labels_from_flags(opts.label_list, opts.label_list_file)

    def labels_from(self, examples):
        labels = classification.label_list_from(examples)
        if _scores(labels):
            # transformers' run_glue.py trains a float label column as regression; as
            # classes, each distinct score would silently become a class of its own.
            path = examples[0].where.rpartition(":")[0] if examples else "--train_file"
            shown = ", ".join(labels[:3]) + (", ..." if len(labels) > 3 else "")
            raise FinetuneError(
                f"{path}: the labels are numbers with fractions ({shown}; {len(labels)} "
                "distinct): scores to predict are run_regressor's (transformers' run_glue.py "
                "trains float labels as regression); to train them as classes, give "
                "--label_list")
        return labels

    def head_dropout(self, opts):
        return opts.classifier_dropout

    def convert(self, examples, tokenizer, labels, common, opts, split):
        arrays, stats = self.packed(examples, tokenizer, labels, common)
        logging.info("%s: %s", split, stats.summary())
        if opts.task_name and self._processor(opts).name == "klue-re":
            _warn_of_unknown_markers(tokenizer, split)
        return Features(arrays, None, stats)

    def evaluate(self, examples, features, outputs, labels, tokenizer, common, opts):
        predicted = outputs["logits"].argmax(-1)
        metrics = accuracy_and_f1(features.arrays["label_ids"], predicted, labels)
        metrics["truncated"] = features.stats.truncated
        metrics["loss"] = mean_cross_entropy(outputs["logits"], features.arrays["label_ids"])
        logging.info("eval: accuracy %.4f  macro F1 %.4f  loss %.4f  (%d examples)",
                     metrics["accuracy"], metrics["macro_f1"], metrics["loss"],
                     metrics["num_examples"])
        metrics.update(self._task_scores(features.arrays["label_ids"], outputs["logits"],
                                         labels, opts))
        if opts.task_name:
            # Google's estimator.evaluate keys. Its "loss" averages per batch; here both
            # losses are the mean over the examples (the same with full batches).
            google = {"eval_accuracy": np.float32(metrics["accuracy"]),
                      "eval_loss": np.float32(metrics["loss"]),
                      # This run's steps, or those of the fine-tuned model it evaluates.
                      "global_step": (trained_steps(common.output_dir) or
                                      trained_steps(common.init_checkpoint or "")),
                      "loss": np.float32(metrics["loss"])}
            files.write_text(os.path.join(common.output_dir, GOOGLE_EVAL_FILE),
                             google_eval_text(google))
        return metrics

    def _task_scores(self, label_ids, logits, labels, opts) -> dict:
        """A task's own scores beside accuracy: KLUE-RE's micro F1 without no_relation and
        its AUPRC (fractions; KLUE's tables show them x100)."""
        from data_prep import glue

        if not opts.task_name or self._processor(opts).name != "klue-re":
            return {}
        scores = {"relation_micro_f1": relation_micro_f1(
                      label_ids, np.asarray(logits).argmax(-1), labels.index(glue.NO_RELATION)),
                  "auprc": average_precision_area(label_ids, softmax(np.asarray(logits)))}
        logging.info("KLUE-RE: micro F1 (without no_relation) %.4f  AUPRC %.4f",
                     scores["relation_micro_f1"], scores["auprc"])
        return scores

    def write_predictions(self, examples, features, outputs, labels, tokenizer, common, opts):
        probs = softmax(outputs["logits"])
        records = [{"where": e.where, **({"id": e.id} if e.id is not None else {}),
                    "label": labels[int(p.argmax())],
                    "probabilities": {label: round(float(q), 6) for label, q in zip(labels, p)}}
                   for e, p in zip(examples, probs)]
        files.write_jsonl(os.path.join(common.output_dir, PREDICTIONS_FILE), records)
        results = {"num_examples": len(records), "truncated": features.stats.truncated}
        if examples and all(e.label in labels for e in examples):
            # Labelled predict data (XNLI's test set, a user's labelled file): its scores,
            # as --do_eval gives them for the eval data.
            gold = [labels.index(e.label) for e in examples]
            scores = accuracy_and_f1(gold, probs.argmax(-1), labels)
            scores.update(self._task_scores(gold, outputs["logits"], labels, opts))
            logging.info("predict: accuracy %.4f  macro F1 %.4f  (%d labelled examples)",
                         scores["accuracy"], scores["macro_f1"], scores["num_examples"])
            results.update(scores)
        if opts.task_name:
            # Columns in the task's label order, which GLUE's scripts read by position (a
            # fine-tuned model's head may order the same labels otherwise).
            order = [labels.index(label) for label in self._processor(opts).labels()]
            files.write_text(os.path.join(common.output_dir, GOOGLE_TEST_FILE),
                             google_test_text(probs[:, order]))
        return results


def labels_from_label_flags(values: dict) -> list[str] | None:
    """The labels that `LABEL_FLAGS`' values ({name: value}) give convert_checkpoint, read as
    run_classifier reads them (a --task_name's labels in Google's order, --label_list,
    --label_list_file); None where none is given.

    Raises:
      FinetuneError: --task_name with --label_list(_file), or an unknown or regression task.
      model_loading.CheckpointError: an empty, repeated or unreadable label.
    """
    from data_prep import glue

    task = values.get("task_name")
    if task and glue.get_processor(task).is_regression():
        # Not run_classifier's advice (run run_regressor with the same flags): this is
        # convert_checkpoint, whose regressors have no labels to name.
        raise FinetuneError(f"--task_name={task}: a regression task (a number per example, "
                            "not a class), which names no labels; drop --task_name")
    return ClassificationTask().given_labels(ClassifierOptions(**values))
