"""Token tagging (NER, POS) as a fine-tuning task: CoNLL files in, one tag per word out.

Reading and conversion are `data_prep.tagging`'s (each word's tag on its first WordPiece);
this adapter adds the head (`BertTagger`), the scores and the predictions file
("word predicted_tag" lines; the input's blank and -DOCSTART- lines kept, so it lines up
with the input file line for line). Scores: token accuracy, and for IOB/IOE/IOBES tag sets
("B-PER" or "B_PER") entity precision/recall/F1 (seqeval's default, conlleval-compatible
chunking, micro-averaged over entity spans).

A sentence longer than --max_seq_length - 2 WordPieces is tagged in windows --doc_stride
WordPieces apart (run_squad's flag and rule: each word is trained on and tagged from the one
window where its first WordPiece has the most context; `data_prep.tagging`), so every word
of the input gets a prediction and is scored once. The default stride is half a window,
`tagging.default_doc_stride`. --doc_stride=0 truncates such sentences instead (as before
windows): a word cut off has no prediction and is written and scored as
`tagging.missing_tag` ("O", or "_" for a tag set without "O").

Character-tagged data (KLUE-NER: --task_name=klue-ner, or --tag_format=klue with the
*_file flags) is read by `data_prep.klue_ner`: each sentence is tokenized whole, its
WordPieces are the units tagged (each with its first character's tag) and go through the
same windows and head; predictions go back to one tag per character (predictions.tsv, in
KLUE's format) and are scored by KLUE's entity and character macro F1.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from absl import logging

from bert_keras import model_loading
from bert_keras.finetuning.runner import (SKIP_PADDING_HELP, Features, FinetuneError,
                                         LabelledFileTask, benchmark_file, labels_from_flags,
                                         recorded_choice)
from bert_keras.tasks import BertTagger
from data_prep import files, klue_ner, tagging
from data_prep.cli import option

PREDICTIONS_FILE = "predictions.conll"


@dataclasses.dataclass(frozen=True)
class _CharStats:
    """The stats of character-tagged data (`Features.stats`), with what maps the units'
    predictions back to characters."""

    tagging: tagging.TaggingStats
    alignment: klue_ner.AlignmentStats
    spans: list  # per sentence, the (start, end) characters of each unit


KLUE_NER = "klue-ner"
KLUE_PREDICTIONS_FILE = "predictions.tsv"  # KLUE-NER's format (`data_prep.klue_ner`)
CONLL, KLUE = "conll", "klue"  # --tag_format
# Flags of the *_file route that --task_name=klue-ner fixes itself.
_FILE_ROUTE_FLAGS = ("token_column", "tag_column", "label_list_file", "tag_format",
                     "text_column_name", "label_column_name")


@dataclasses.dataclass(frozen=True)
class TaggerOptions:
    task_name: str | None = option(
        None, "klue-ner: KLUE's named entity recognition, read from --data_dir as KLUE lays "
        "it out (klue-ner-v1.1_train.tsv; its dev file serves --do_eval and --do_predict), "
        "tagged per character with KLUE's tags and scored by KLUE's entity and character "
        "macro F1.")
    tag_format: str | None = option(
        None, "The *_file flags' format (default: conll; evaluating or predicting alone, the "
        "format the model was fine-tuned on). conll: one \"word ... tag\" line per word; klue: "
        "KLUE-NER's \"character<TAB>tag\" lines under \"## <guid>\" lines (each sentence "
        "tokenized whole, every character tagged, predictions.tsv in the same format).",
        enum=(CONLL, KLUE))
    data_dir: str | None = option(None, "Directory the *_file flags are relative to (with "
                                  "--task_name, the task's directory or KLUE's "
                                  "klue_benchmark/).")
    train_file: str | None = option(None, "Training data (CoNLL format: word ... tag per "
                                    "line; or --tag_format's; .json/.jsonl: transformers' "
                                    "run_ner.py JSON lines).")
    eval_file: str | None = option(None, "Tagged evaluation data.")
    predict_file: str | None = option(None, "Data to tag (CoNLL: tag column optional; "
                                      "--tag_format=klue: tags required, not read).")
    token_column: int = option(0, "Column of the word.")
    tag_column: int = option(-1, "Column of the tag (negative: from the end).")
    label_list_file: str | None = option(None, "Tags in id order, one a line; default: the "
                                         "sorted tags of --train_file. Also names the tag "
                                         "ids of a JSON file's tags.")
    text_column_name: str = option("tokens", "A .json/.jsonl file (transformers' run_ner.py "
                                   "data, one object per line): the key of the words.")
    label_column_name: str = option("ner_tags", "A .json/.jsonl file: the key of the tags "
                                    "(names, or ids named by --label_list_file).")
    doc_stride: int | None = option(
        None, "A sentence longer than --max_seq_length - 2 WordPieces is read in windows "
        "this many WordPieces apart (run_squad's flag), each word tagged from the window "
        "that gives it the most context, so no word is lost. Default: half a window, "
        "(--max_seq_length - 2) // 2. 0: truncate such sentences instead (the words cut "
        "off are written and scored as \"O\", or \"_\").")
    tagger_dropout: float = option(0.1, "Dropout on the sequence output.")
    skip_padding: bool = option(True, SKIP_PADDING_HELP)
    allow_single_class: bool = option(False, "Accept a --train_file whose words all have one "
                                      "tag (otherwise an error).")


def token_accuracy(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> float:
    """Fraction of words whose predicted tag equals the gold tag (over all sentences)."""
    total = correct = 0
    for i, (g, p) in enumerate(zip(gold, predicted, strict=True)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted")
        total += len(g)
        correct += sum(a == b for a, b in zip(g, p))
    if total == 0:
        raise ValueError("no words to score")
    return correct / total


def is_chunk_tag(tag: str) -> bool:
    """"B-PER", "I_LOC", ...: a chunk tag of IOB/IOE/IOBES/BILOU, "-" or "_" separated."""
    return len(tag) > 2 and tag[1] in "-_" and tag[0] in "BIESLU"


def _split_tag(tag: str) -> tuple[str, str]:
    """("B", "PER") for "B-PER"; ("O", "") for "O"; a bare tag "X" is treated as ("I", "X")."""
    if tag == "O":
        return "O", ""
    if is_chunk_tag(tag):
        return tag[0], tag[2:]
    return "I", tag


def _end_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """conlleval's endOfChunk: does a chunk end at the previous word?"""
    if prev_tag in ("E", "S"):
        return True
    if prev_tag in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev_tag != "O" and prev_type != type_


def _start_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """conlleval's startOfChunk: does a chunk start at this word?"""
    if tag in ("B", "S"):
        return True
    if prev_tag in ("E", "S", "O") and tag in ("E", "I"):
        return True
    return tag != "O" and prev_type != type_


def get_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """Entity chunks (type, first word, last word) in one sentence, conlleval-style.

    Accepts IOB1 ("I-X" after "O" or another type opens a chunk), IOB2, IOE and IOBES
    (S- = single, E-/L- = end, U- = unit); a tag without prefix counts as "I-" of itself.
    """
    chunks = []
    prev_tag, prev_type, start = "O", "", None
    for i, tag in enumerate(list(tags) + ["O"]):  # the sentinel closes a final chunk
        prefix, type_ = _split_tag(tag)
        prefix = {"L": "E", "U": "S"}.get(prefix, prefix)
        if start is not None and _end_of_chunk(prev_tag, prefix, prev_type, type_):
            chunks.append((prev_type, start, i - 1))
            start = None
        if _start_of_chunk(prev_tag, prefix, prev_type, type_):
            start = i
        prev_tag, prev_type = prefix, type_
    return chunks


def entity_f1(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict:
    """Entity-level precision, recall and F1, micro-averaged over all sentences (seqeval default).

    An entity counts as correct only if its type, first and last word all match.

    Returns:
      {"precision", "recall", "f1", "num_gold", "num_predicted", "num_correct",
       "per_type": {type: {"precision", "recall", "f1", "support"}}}.
    """
    gold_set, pred_set = set(), set()
    for i, (g, p) in enumerate(zip(gold, predicted, strict=True)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted")
        gold_set |= {(i, *c) for c in get_entities(g)}
        pred_set |= {(i, *c) for c in get_entities(p)}

    return tagging.entity_scores(gold_set, pred_set)


class TaggingTask(LabelledFileTask):
    name = "tagger"
    # --doc_stride too: it decides which windows a long sentence's words are trained in.
    training_flags = ("tagger_dropout", "skip_padding", "doc_stride")
    # Evaluating or predicting alone: the stride the model was fine-tuned with, as
    # export_tagger takes it (else half a window, `with_defaults`).
    recorded_options = {"doc_stride": None}
    model_class = BertTagger
    predictions_file = PREDICTIONS_FILE

    def options_class(self):
        return TaggerOptions

    @staticmethod
    def _characters(opts) -> bool:
        """Whether the data is character-tagged (KLUE-NER's format)."""
        return bool(opts.task_name) or opts.tag_format == KLUE

    def input_flag(self, split):
        return f"--{split}_file (or --task_name with --data_dir)"

    def input_file(self, split, opts):
        if not opts.task_name:
            return super().input_file(split, opts)
        name = klue_ner.FILES["train" if split == "train" else "dev"]
        return benchmark_file(opts.data_dir, name, klue_ner.DIRECTORY, KLUE_NER, split)

    def output_files(self, common, opts):
        names = super().output_files(common, opts)
        if self._characters(opts):
            names = [KLUE_PREDICTIONS_FILE if n == PREDICTIONS_FILE else n for n in names]
        return names

    def result_files(self, common, opts):
        return super().result_files(common, opts) + [KLUE_PREDICTIONS_FILE, PREDICTIONS_FILE]

    def with_defaults(self, common, opts):
        if opts.tag_format is None:  # recorded as the format read
            opts = dataclasses.replace(opts, tag_format=KLUE if opts.task_name else (
                recorded_choice(common, "tag_format", (CONLL, KLUE)) or CONLL))
        if opts.doc_stride is None:
            return dataclasses.replace(
                opts, doc_stride=tagging.default_doc_stride(common.max_seq_length))
        return opts

    def validate(self, common, opts):
        if opts.task_name:
            if opts.task_name.strip().lower() != KLUE_NER:
                raise FinetuneError(f"--task_name: unknown tagging task {opts.task_name!r}; "
                                    f"known: {KLUE_NER} (or --train_file and the other "
                                    "*_file flags)")
            if any(getattr(opts, f"{s}_file") for s in ("train", "eval", "predict")):
                raise FinetuneError("--task_name reads its files from --data_dir; drop "
                                    "--train_file / --eval_file / --predict_file")
            given = [f"--{f.name}" for f in dataclasses.fields(opts) if f.name in
                     _FILE_ROUTE_FLAGS and getattr(opts, f.name) not in (f.default, KLUE)]
            if given:  # Each would be silently ignored: the task fixes format and tags.
                raise FinetuneError(f"--task_name={KLUE_NER} reads KLUE's format and tags; "
                                    f"drop {' / '.join(given)}")
        elif self._characters(opts):
            moved = [f"--{name}" for name in ("token_column", "tag_column")
                     if getattr(opts, name) != TaggerOptions.__dataclass_fields__[name].default]
            if moved:
                raise FinetuneError(f"--tag_format={KLUE} has no columns to choose (a "
                                    f"character, a tab, its tag); drop {' / '.join(moved)}")
        else:
            json_files = [getattr(opts, f"{s}_file") for s in ("train", "eval", "predict")
                          if getattr(opts, f"{s}_file") and
                          tagging.is_json_lines(getattr(opts, f"{s}_file"))]
            moved = [f"--{name}" for name in ("token_column", "tag_column")
                     if getattr(opts, name) != TaggerOptions.__dataclass_fields__[name].default]
            if json_files and moved:  # a CoNLL column would be silently unused
                raise FinetuneError(
                    f"{' / '.join(moved)}: {json_files[0]} is read as transformers' run_ner.py "
                    "JSON lines, whose words and tags --text_column_name and "
                    "--label_column_name name; drop the CoNLL column flags")
            keys = [f"--{name}" for name in ("text_column_name", "label_column_name")
                    if getattr(opts, name) != TaggerOptions.__dataclass_fields__[name].default]
            given = [getattr(opts, f"{s}_file") for s in ("train", "eval", "predict")
                     if getattr(opts, f"{s}_file")]
            if given and keys and not json_files:  # and a JSON key, likewise
                raise FinetuneError(
                    f"{' / '.join(keys)}: {given[0]} is read as CoNLL columns, which "
                    "--token_column and --tag_column name; drop the JSON key flags")
        room = common.max_seq_length - 2
        if room < 1:
            raise FinetuneError(f"--max_seq_length={common.max_seq_length} leaves no room for "
                                "a word ([CLS] and [SEP] take 2); expected >= 3")
        if opts.doc_stride < 0:
            raise FinetuneError(f"--doc_stride must be >= 0 (0: truncate long sentences); "
                                f"received {opts.doc_stride}")
        if opts.doc_stride > room:
            raise FinetuneError(
                f"--doc_stride={opts.doc_stride} must not exceed --max_seq_length="
                f"{common.max_seq_length} - 2 ([CLS] and [SEP]), the WordPieces of a window, "
                "or windows would skip words (0 truncates long sentences instead)")

    def read(self, path, split, opts):
        if self._characters(opts):
            return klue_ner.read_klue_ner(path, has_tags=split != "predict")
        if tagging.is_json_lines(path):  # transformers' run_ner.py data
            names = (model_loading.read_labels(opts.label_list_file) if opts.label_list_file
                     else None)
            return tagging.read_json_lines(path, opts.text_column_name, opts.label_column_name,
                                           has_tags=split != "predict", tag_names=names)
        return tagging.read_conll(path, opts.token_column, opts.tag_column,
                                  has_tags=split != "predict")

    def given_labels(self, opts):
        if opts.task_name:
            return list(klue_ner.KLUE_NER_LABELS)
        labels = labels_from_flags(None, opts.label_list_file)
        missing = klue_ner.missing_inside_tags(labels) if labels and self._characters(opts) \
            else []
        if missing:
            raise FinetuneError(
                f"--label_list_file {opts.label_list_file}: no {', '.join(missing)}; character "
                "tags continue an entity of type X with I-X (a WordPiece's later characters, "
                "a space inside the entity), so every B-X needs its I-X")
        return labels

    def labels_from(self, sentences):
        labels = tagging.label_list_from(sentences)  # words' or characters' tags alike
        if sentences and isinstance(sentences[0], klue_ner.CharSentence):
            missing = klue_ner.missing_inside_tags(labels)
            if missing:  # the types whose entities are one character in the training file
                logging.info("Label list: %s added (character tags continue an entity with "
                             "I-X; the training file has none)", ", ".join(missing))
                labels = sorted(labels + missing)
        return labels

    def head_dropout(self, opts):
        return opts.tagger_dropout

    def convert(self, sentences, tokenizer, labels, common, opts, split):
        labels = labels if split != "predict" else None
        spans = alignment = None
        if self._characters(opts):
            sentences, spans, alignment = klue_ner.to_units(sentences, tokenizer, labels)
            logging.info("%s: %s", split, alignment.summary())
        arrays, positions, stats = tagging.convert_sentences(
            sentences, tokenizer, labels, common.max_seq_length, opts.doc_stride)
        logging.info("%s: %s", split, stats.summary())
        if alignment is not None:
            stats = _CharStats(stats, alignment, spans)
        return Features(arrays, positions, stats)

    @staticmethod
    def _counts(stats) -> dict:
        """The conversion's counts, as the results files report them."""
        counts = {}
        if isinstance(stats, _CharStats):
            counts = {"num_characters": stats.alignment.characters,
                      "num_units": stats.alignment.units,
                      "entities_cut_by_pieces": stats.alignment.cut_entities}
            stats = stats.tagging
        return {**counts, "num_windows": stats.windows, "doc_stride": stats.doc_stride,
                "split_sentences": stats.split_sentences,
                "truncated_sentences": stats.truncated_sentences,
                "truncated_words": stats.truncated_words}

    def train_summary(self, features, read_info):
        # tag_format: what export_tagger serves (characters or words).
        return {**self._counts(features.stats),
                "tag_format": KLUE if isinstance(features.stats, _CharStats) else CONLL}

    def _tags(self, features, outputs, labels):
        return tagging.predictions_to_tags(outputs["logits"].argmax(-1), features.extra, labels)

    def _char_tags(self, sentences, features, outputs, labels):
        """Character-tagged data: one predicted tag per character of each sentence."""
        return [klue_ner.char_tags(s.text, spans, tags) for s, spans, tags in
                zip(sentences, features.stats.spans, self._tags(features, outputs, labels),
                    strict=True)]

    def evaluate(self, sentences, features, outputs, labels, tokenizer, common, opts):
        if isinstance(features.stats, _CharStats):
            return self._evaluate_characters(sentences, features, outputs, labels)
        predicted = self._tags(features, outputs, labels)
        gold = [list(s.tags) for s in sentences]
        stats = features.stats
        # Every word counts once; words cut off by --doc_stride=0's truncation are scored
        # as tagged "O" (or "_"): right where that is their gold tag, wrong elsewhere.
        metrics = {"token_accuracy": token_accuracy(gold, predicted),
                   "num_sentences": len(sentences), "num_words": stats.words,
                   **self._counts(stats)}
        if any(is_chunk_tag(t) for s in gold for t in s):
            metrics["entity"] = entity_f1(gold, predicted)
        logging.info("eval: token accuracy %.4f%s (%d words)", metrics["token_accuracy"],
                     f", entity F1 {metrics['entity']['f1']:.4f}" if "entity" in metrics else "",
                     stats.words)
        return metrics

    def _evaluate_characters(self, sentences, features, outputs, labels):
        predicted = self._char_tags(sentences, features, outputs, labels)
        metrics = klue_ner.scores([s.text for s in sentences], [s.tags for s in sentences],
                                  predicted, labels)
        metrics.update({"num_sentences": len(sentences), **self._counts(features.stats)})
        logging.info("eval: entity macro F1 %.4f, character macro F1 %.4f (KLUE's scores; "
                     "entity micro F1 %.4f, %d characters scored)", metrics["entity_macro_f1"],
                     metrics["char_macro_f1"], metrics["entity"]["f1"],
                     metrics["num_scored_characters"])
        return metrics

    def write_predictions(self, sentences, features, outputs, labels, tokenizer, common, opts):
        if isinstance(features.stats, _CharStats):
            files.write_text(os.path.join(common.output_dir, KLUE_PREDICTIONS_FILE),
                             klue_ner.predictions_text(
                                 sentences, self._char_tags(sentences, features, outputs,
                                                            labels)))
            return {"num_sentences": len(sentences), **self._counts(features.stats)}
        predicted = self._tags(features, outputs, labels)
        files.write_text(os.path.join(common.output_dir, PREDICTIONS_FILE),
                         tagging.predictions_text(sentences, predicted))
        if features.stats.truncated_words:
            logging.warning("%d words past --max_seq_length have no prediction (--doc_stride=0 "
                            "truncates): written as %r in %s", features.stats.truncated_words,
                            tagging.missing_tag(labels), PREDICTIONS_FILE)
        return {"num_sentences": len(sentences), "num_words": features.stats.words,
                **self._counts(features.stats)}
