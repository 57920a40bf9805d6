"""SQuAD-style span question answering as a fine-tuning task, with the official scores.

Reading, windowing and mapping logits back to text are `data_prep.squad`'s (Google's
run_squad.py); this adapter adds the head (`BertSpanQA`), the files Google's tool writes
(predictions.json, nbest_predictions.json, null_odds.json for v2.0) and the official
evaluation of the benchmark the data comes from (`evaluate`, --eval_metric); --do_eval
scores the predictions of --predict_file. Every score is the maximum over a question's gold
answers, averaged over the questions, in percent:

  squad     SQuAD's v1.1 script, or its v2.0 script with --version_2_with_negative: answers
            lower-cased, without punctuation and the articles a/an/the, whitespace
            collapsed; exact match and F1 over the words ("f1").
  korquad   KorQuAD 1.0's script (korquad.github.io): quotes and brackets
            ('"《》<>〈〉()‘’) become spaces, then lower case, no punctuation, whitespace
            collapsed; exact match, and F1 over the characters ("f1"): Korean words carry
            their particles ("서울시는"), so a word F1 gives nothing for a right answer
            with another particle.
  klue-mrc  KLUE-MRC's (KLUE-baseline's klue_mrc_em and klue_mrc_rouge_w): lower case, no
            punctuation, whitespace collapsed; exact match, and ROUGE-W ("rouge_w"): the F1
            of the longest common run of characters. An unanswerable question's gold is "".
            Also by KLUE's question type ("type1_exact_match", ...: 1 paraphrase,
            2 multi-sentence reasoning, 3 unanswerable), as KLUE's baseline logs them.

--task_name=korquad / klue-mrc reads the benchmark's files from --data_dir and scores them
with its metric (klue-mrc as SQuAD 2.0: its questions may have no answer).
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import os
import re
import string
from typing import Callable, Mapping, Sequence

from absl import logging

from bert_keras.finetuning.runner import (Features, FinetuneError, Task, benchmark_file,
                                          recorded_choice, under_data_dir)
from bert_keras.tasks import BertSpanQA
from data_prep import files, squad
from data_prep.cli import option


SQUAD, KORQUAD, KLUE_MRC = "squad", "korquad", "klue-mrc"  # --eval_metric
METRICS = (SQUAD, KORQUAD, KLUE_MRC)
# --task_name: (its files, under --data_dir or the named directory there; SQuAD 2.0?).
TASKS = {KORQUAD: (("KorQuAD_v1.0_train.json", "KorQuAD_v1.0_dev.json"), "", False),
         KLUE_MRC: (("klue-mrc-v1.1_train.json", "klue-mrc-v1.1_dev.json"), "klue-mrc-v1.1",
                    True)}


@dataclasses.dataclass(frozen=True)
class SquadOptions:
    task_name: str | None = option(
        None, "korquad: KorQuAD 1.0 (KorQuAD_v1.0_{train,dev}.json); klue-mrc: KLUE-MRC "
        "(klue-mrc-v1.1_{train,dev}.json, SQuAD 2.0's layout). Read from --data_dir, the "
        "dev file answered by --do_predict and scored by --do_eval with the benchmark's "
        "metric.")
    data_dir: str | None = option(None, "Directory --train_file and --predict_file are "
                                  "relative to (with --task_name, the task's directory, or "
                                  "KLUE's klue_benchmark/).")
    train_file: str | None = option(None, "SQuAD JSON for training.")
    predict_file: str | None = option(None, "SQuAD JSON to answer (and score with --do_eval).")
    eval_metric: str | None = option(
        None, "--do_eval's scores: squad (SQuAD's script: exact match, F1 over words), "
        "korquad (KorQuAD 1.0's: F1 over characters), klue-mrc (KLUE's: exact match, "
        "ROUGE-W). Default: --task_name's; evaluating alone, what the model was fine-tuned "
        "with; else squad.", enum=METRICS)
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
    return _bag_f1(normalize_answer(prediction).split(), normalize_answer(gold).split(),
                   version_2)


def _bag_f1(pred_items: Sequence[str], gold_items: Sequence[str], version_2: bool) -> float:
    if version_2 and (not pred_items or not gold_items):
        return float(list(pred_items) == list(gold_items))
    common = collections.Counter(pred_items) & collections.Counter(gold_items)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_items)
    recall = same / len(gold_items)
    return 2 * precision * recall / (precision + recall)


_KORQUAD_SPACED = re.compile("['\"《》<>〈〉()‘’]")


def normalize_korquad(s: str) -> str:
    """KorQuAD 1.0's normalisation: its quotes and brackets become spaces, then lower case,
    no punctuation (ASCII's), whitespace collapsed. Articles stay (Korean has none)."""
    s = _KORQUAD_SPACED.sub(" ", s).lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    return " ".join(s.split())


def korquad_f1(prediction: str, gold: str, version_2: bool = False) -> float:
    """KorQuAD 1.0's F1: over the characters of the normalised strings, spaces left out,
    with multiplicity. With `version_2` an empty answer scores as SQuAD 2.0's script scores
    it (1 against an empty answer, else 0; KorQuAD 1.0 has no unanswerable questions)."""
    return _bag_f1(list(normalize_korquad(prediction).replace(" ", "")),
                   list(normalize_korquad(gold).replace(" ", "")), version_2)


# KLUE-baseline's pattern, kept as written there: a character class followed by the literal
# "()‘’", so it replaces only such 5-character runs, and "《토지》" keeps its brackets (KLUE's
# published scores were computed with it).
_KLUE_REPLACED = re.compile(r"[\'\"《》<>〈〉]\(\)\‘\’")


def normalize_klue_mrc(s: str) -> str:
    """KLUE-MRC's normalisation: lower case, no punctuation (ASCII's), whitespace collapsed."""
    s = _KLUE_REPLACED.sub(" ", s.lower())
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    return " ".join(s.split())


def rouge_w(prediction: str, gold: str) -> float:
    """KLUE-MRC's ROUGE-W of two normalised strings: the F1 of the longest common run of
    consecutive characters (difflib's, as KLUE's); an empty gold scores 1 against an empty
    prediction, else 0."""
    if not gold:
        return float(prediction == gold)
    longest = difflib.SequenceMatcher(None, prediction, gold).find_longest_match(
        0, len(prediction), 0, len(gold)).size
    if not longest:
        return 0.0
    precision, recall = longest / len(prediction), longest / len(gold)
    return 2 * precision * recall / (precision + recall)


@dataclasses.dataclass(frozen=True)
class _Script:
    """One benchmark's scoring: exact match and a partial score, each of (prediction,
    gold answers) -> the best over the gold answers."""

    partial_name: str
    exact: Callable[[str, Sequence[str]], float]
    partial: Callable[[str, Sequence[str]], float]


def _script(metric: str, version_2: bool) -> _Script:
    if metric == SQUAD:
        return _Script("f1", lambda p, golds: max(exact_match(p, g) for g in golds),
                       lambda p, golds: max(f1(p, g, version_2) for g in golds))
    if metric == KORQUAD:
        return _Script(
            "f1", lambda p, golds: max(float(normalize_korquad(p) == normalize_korquad(g))
                                       for g in golds),
            lambda p, golds: max(korquad_f1(p, g, version_2) for g in golds))
    if metric == KLUE_MRC:
        # KLUE's compute_em_and_rouge_w_score_for_klue_mrc, on normalised strings.
        def both(p, golds, score):
            p = normalize_klue_mrc(p)
            return max(score(p, normalize_klue_mrc(g)) for g in golds)
        return _Script("rouge_w", lambda p, golds: both(p, golds, lambda a, b: float(a == b)),
                       lambda p, golds: both(p, golds, rouge_w))
    raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")


def gold_answers(path: str, version_2_with_negative: bool = False) -> dict[str, list[str]]:
    """{qas_id: gold answer texts} from a SQuAD file ([] for a v2.0 unanswerable question)."""
    examples, _ = squad.read_squad(path, is_training=False,
                                   version_2_with_negative=version_2_with_negative)
    return {example.qas_id: list(example.answers) for example in examples}


def evaluate(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
             version_2_with_negative: bool = False, metric: str = SQUAD,
             question_types: Mapping[str, int] | None = None) -> dict:
    """Exact match and the metric's partial score in percent, each the max over a
    question's gold answers.

    Args:
      gold: {qas_id: [gold texts]} (from `gold_answers`; [] = unanswerable, v2.0 only).
      predictions: {qas_id: predicted text}. A question without a prediction scores 0 and is
        counted in "missing".
      version_2_with_negative: use the v2.0 script's F1 for empty answers and add the
        HasAns_/NoAns_ breakdown.
      metric: squad, korquad or klue-mrc (the module's docstring).
      question_types: {qas_id: KLUE's question type}, for klue-mrc's breakdown by type (a
        question without one is type 1, as in KLUE's reader).

    Returns:
      {"exact_match", "f1" (klue-mrc: "rouge_w"), "total", "missing"} (+ "HasAns_exact",
      "HasAns_f1", "HasAns_total", "NoAns_exact", "NoAns_f1", "NoAns_total" for v2.0; +
      "type<t>_exact_match", "type<t>_rouge_w", "type<t>_total" for klue-mrc).
    """
    if not gold:
        raise FinetuneError("no gold answers to score against")
    script = _script(metric, version_2_with_negative)
    em_scores, partial_scores, missing = {}, {}, 0
    for qas_id, answers in gold.items():
        if metric == KLUE_MRC:
            answers = list(answers) or [""]  # KLUE's: "" is an unanswerable one's gold
        elif version_2_with_negative:
            # The v2.0 script drops answers that normalise to "" and scores an unanswerable
            # question against the empty string.
            normalize = normalize_korquad if metric == KORQUAD else normalize_answer
            answers = [a for a in answers if normalize(a)] or [""]
        elif not answers:
            raise FinetuneError(f"question {qas_id!r} has no gold answer (a v2.0 file? pass "
                                "--version_2_with_negative)")
        if qas_id not in predictions:
            missing += 1
            em_scores[qas_id] = partial_scores[qas_id] = 0.0
            continue
        prediction = predictions[qas_id]
        em_scores[qas_id] = script.exact(prediction, answers)
        partial_scores[qas_id] = script.partial(prediction, answers)

    def block(ids, prefix="", exact="exact"):
        n = len(ids)
        return {f"{prefix}{exact}": 100.0 * sum(em_scores[q] for q in ids) / n if n else 0.0,
                f"{prefix}{script.partial_name}":
                    100.0 * sum(partial_scores[q] for q in ids) / n if n else 0.0,
                f"{prefix}total": n}

    result = {**block(list(gold), exact="exact_match"), "missing": missing}
    if version_2_with_negative:
        has = [q for q, a in gold.items() if a]  # the v2.0 script: bool(qa["answers"])
        no = [q for q, a in gold.items() if not a]
        result.update(block(has, "HasAns_"))
        result.update(block(no, "NoAns_"))
    if metric == KLUE_MRC:
        # A question without a type is type 1, as KLUE's reader has it
        # (`qa.get("question_type", 1)`, klue_baseline/data/klue_mrc.py).
        kinds = {q: (question_types or {}).get(q, 1) for q in gold}
        for kind in sorted(set(kinds.values())):
            result.update(block([q for q in gold if kinds[q] == kind], f"type{kind}_",
                                exact="exact_match"))
    return result


def _task(opts) -> str:
    name = opts.task_name.strip().lower()
    if name not in TASKS:
        raise FinetuneError(f"--task_name: unknown span-QA task {opts.task_name!r}; known: "
                            f"{', '.join(TASKS)} (or --train_file and --predict_file)")
    return name


class SquadTask(Task):
    name = "span-QA"
    model_class = BertSpanQA
    uses_labels = False
    default_max_seq_length = 384  # Google's run_squad.py
    # They decide the training windows and their labels (named when a rerun differs; the
    # features' CRC changes with them too).
    training_flags = ("doc_stride", "max_query_length", "version_2_with_negative")
    # What predicting or evaluating alone takes from the model's fine-tuning (as
    # export_span_qa does), and Google's defaults.
    recorded_options = {"max_query_length": 64, "doc_stride": 128, "max_answer_length": 30,
                        "version_2_with_negative": False, "null_score_diff_threshold": 0.0}

    def options_class(self):
        return SquadOptions

    def input_flag(self, split):
        return ("--train_file" if split == "train" else "--predict_file") + \
            " (or --task_name with --data_dir)"

    def task_settings(self, opts):
        if not opts.task_name:
            return {}
        name = _task(opts)
        return {"version_2_with_negative": TASKS[name][2], "eval_metric": name}

    def input_file(self, split, opts):
        if not opts.task_name:
            return under_data_dir(opts.train_file if split == "train" else opts.predict_file,
                                  opts.data_dir)
        names, directory, _ = TASKS[_task(opts)]
        return benchmark_file(opts.data_dir, names[split != "train"], directory, _task(opts),
                              "train" if split == "train" else "dev")

    def with_defaults(self, common, opts):
        if opts.eval_metric is None:  # recorded as the metric the run scored with
            opts = dataclasses.replace(opts, eval_metric=recorded_choice(
                common, "eval_metric", METRICS) or SQUAD)
        return opts

    def validate(self, common, opts):
        if opts.task_name and (opts.train_file or opts.predict_file):
            raise FinetuneError("--task_name reads its files from --data_dir; drop "
                                "--train_file / --predict_file")
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
        # A warning where the file's offsets count UTF-16 units: its spans are misplaced.
        (logging.warning if stats.utf16_offsets else logging.info)("%s: %s", split,
                                                                   stats.summary())
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

    def epoch_size(self, examples, features):
        # Google's run_squad: int(len(train_examples) / batch * epochs) steps, its examples
        # the questions kept for training, though it trains on their windows. Counting the
        # windows trained more steps than Google's command wherever a context spans several.
        return len(examples)

    def train_summary(self, features, read_info):
        return {"questions": read_info.questions,
                "answers_not_found": [list(x) for x in read_info.answers_not_found],
                "windows": features.stats.features,
                "questions_truncated": features.stats.questions_truncated}

    def export_settings(self, opts):
        # eval_metric: what an evaluation of this model alone scores with.
        return {"max_query_length": opts.max_query_length, "doc_stride": opts.doc_stride,
                "max_answer_length": opts.max_answer_length,
                "null_score_diff_threshold": opts.null_score_diff_threshold,
                "version_2_with_negative": opts.version_2_with_negative,
                "eval_metric": opts.eval_metric}

    def _answer(self, examples, features, outputs, tokenizer, common, opts):
        predictions, nbest, null_odds = squad.postprocess(
            examples, features.extra, outputs["start_logits"], outputs["end_logits"],
            opts.n_best_size, opts.max_answer_length, tokenizer.config,
            opts.version_2_with_negative, opts.null_score_diff_threshold)
        out = common.output_dir
        # As Google's run_squad writes them: questions in the predict file's order, its
        # n-best entries' keys in its order, non-ASCII escaped (the evaluate scripts open
        # them in the platform's encoding). Sorted ids and raw UTF-8 broke scripts that read
        # the answers in file order, and a Windows reader's cp1252 turned a non-ASCII id
        # into a missing prediction.
        files.write_json(os.path.join(out, "predictions.json"), predictions, **files.GOOGLE_JSON)
        files.write_json(os.path.join(out, "nbest_predictions.json"), nbest, **files.GOOGLE_JSON)
        if opts.version_2_with_negative:
            files.write_json(os.path.join(out, "null_odds.json"), null_odds, **files.GOOGLE_JSON)
        return predictions

    def evaluate(self, examples, features, outputs, labels, tokenizer, common, opts):
        predictions = self._answer(examples, features, outputs, tokenizer, common, opts)
        gold = {e.qas_id: list(e.answers) for e in examples}
        types = {e.qas_id: e.question_type for e in examples if e.question_type is not None}
        metrics = evaluate(gold, predictions, opts.version_2_with_negative, opts.eval_metric,
                           types)
        partial = _script(opts.eval_metric, opts.version_2_with_negative).partial_name
        logging.info("eval (%s): EM %.2f  %s %.2f  (%d questions)", opts.eval_metric,
                     metrics["exact_match"], partial, metrics[partial], metrics["total"])
        return metrics

    def write_predictions(self, examples, features, outputs, labels, tokenizer, common, opts):
        self._answer(examples, features, outputs, tokenizer, common, opts)
        return {"questions": len(examples), "windows": features.stats.features}
