"""GLUE and XNLI tasks as Google's run_classifier.py reads them, and the Korean KorNLI,
KorSTS, NSMC and KLUE's NLI, STS, YNAT and RE: `--task_name` + `--data_dir`.

`get_processor(task_name)` returns a `GlueProcessor` whose `load(data_dir, split)` reads the
file that Google's processor (or, for tasks Google's repo lacks, transformers' GLUE processor)
reads for that split, from the layout of the official GLUE download (`glue_data/<TASK>/`) or,
for XNLI, the XNLI-1.0 + XNLI-MT-1.0 layout of Google's README; for KorNLI and KorSTS,
Kakao Brain's KorNLUDatasets repository (github.com/kakaobrain/KorNLUDatasets). Splits: "train" (do_train),
"dev" (do_eval), "test" (do_predict). Examples are `classification.Example(where, text_a,
text_b, label)` with `where` = "file:line"; labels are strings, and `labels()` is the label
list in Google's order (label id = position), so `classification.convert_examples` takes
them as they are.

Task names are case-insensitive. Columns are 0-based; "fields" is the exact number of
tab-separated fields every row (the header too) must have. Test files of GLUE have no labels
(label None; the id column is kept for writing predictions).

  task          split  file (under --data_dir)               header fields text_a text_b label id
  cola          train  train.tsv                             no     4      3      -      1     -
                dev    dev.tsv                               no     4      3      -      1     -
                test   test.tsv                              yes    2      1      -      -     0
  sst-2, sst2   train  train.tsv                             yes    2      0      -      1     -
                dev    dev.tsv                               yes    2      0      -      1     -
                test   test.tsv                              yes    2      1      -      -     0
  mrpc          train  train.tsv                             yes    5      3      4      0     -
                dev    dev.tsv                               yes    5      3      4      0     -
                test   test.tsv                              yes    5      3      4      -     0
  qqp (1)       train  train.tsv                             yes    6      3      4      5     0
                dev    dev.tsv                               yes    6      3      4      5     0
                test   test.tsv                              yes    3      1      2      -     0
  mnli          train  train.tsv                             yes    12     8      9      11    0
                dev    dev_matched.tsv                       yes    16     8      9      15    0
                test   test_matched.tsv                      yes    10     8      9      -     0
  mnli-mm       train  train.tsv (as mnli)                   yes    12     8      9      11    0
                dev    dev_mismatched.tsv                    yes    16     8      9      15    0
                test   test_mismatched.tsv                   yes    10     8      9      -     0
  qnli, rte,    train  train.tsv                             yes    4      1      2      3     0
  wnli          dev    dev.tsv                               yes    4      1      2      3     0
                test   test.tsv                              yes    3      1      2      -     0
  xnli (2)      train  multinli/multinli.train.<lang>.tsv    yes    3      0      1      2     -
                dev    xnli.dev.tsv                          yes    19     6      7      1     9
                test   xnli.test.tsv                         yes    19     6      7      1     9
  sts-b, stsb   train  train.tsv                             yes    10     7      8      9     0
  (3)           dev    dev.tsv                               yes    10     7      8      9     0
                test   test.tsv                              yes    9      7      8      -     0
  kornli (4)    train  multinli.train.ko.tsv, then           yes    3      0      1      2     -
                       snli_1.0_train.ko.tsv
                dev    xnli.dev.ko.tsv                       yes    3      0      1      2     -
                test   xnli.test.ko.tsv                      yes    3      0      1      2     -
  korsts (4)    train  sts-train.tsv                         yes    7      5      6      4     -
                dev    sts-dev.tsv                           yes    7      5      6      4     -
                test   sts-test.tsv                          yes    7      5      6      4     -
  nsmc (5)      train  ratings_train.txt                     yes    3      1      -      2     0
                dev    ratings_test.txt                      yes    3      1      -      2     0
                test   ratings_test.txt                      yes    3      1      -      2     0

  Label lists (id order):
    cola, sst-2, mrpc, qqp, wnli,  ["0", "1"]
    nsmc
    mnli, mnli-mm, xnli, kornli    ["contradiction", "entailment", "neutral"]
    qnli, rte                      ["entailment", "not_entailment"]
    sts-b, korsts                  none: a regression task, the label a number (a 0-5
                                   similarity score); run_regressor trains it, run_classifier
                                   refuses it (`GlueProcessor.is_regression`)

  (1) QQP: a row with the wrong number of fields (in GLUE's train.tsv, a question broken
      across lines) is skipped, as transformers' QqpProcessor skips rows it cannot index;
      every skipped row is listed in `GlueSplit.skipped` ("file:line: found N fields,
      expected M") and `*_examples` log their count; never silently. (transformers keeps a
      row with too many fields, reading shifted columns; it is skipped and reported here.)
  (2) XNLI: `language` (Google hard-codes "zh"; default "zh" here) picks the train file
      and the dev/test rows whose column 0 is that language; train labels "contradictory"
      are read as "contradiction", as Google does. The directory is the one of Google's
      README: XNLI-1.0's xnli.dev.tsv (and xnli.test.tsv) next to XNLI-MT-1.0's multinli/;
      else the two archives unpacked side by side, as transformers' XnliProcessor reads
      them (`XNLI-MT-1.0/multinli/...` and `XNLI-1.0/xnli.dev.tsv` under data_dir).
      Google's XnliProcessor has no test set; "test" here reads xnli.test.tsv, laid out like
      xnli.dev.tsv and labelled (its labels are kept, so test accuracy can be computed).
  (3) STS-B: transformers' StsbProcessor's columns (Google's repository has no STS-B); a
      label that is not a number is refused, naming file:line.
  (4) KorNLI, KorSTS (Ham et al. 2020): --data_dir is the repository's KorNLI/ (KorSTS/)
      directory, or the repository itself holding it. KorNLI trains on its two translated
      training sets together (MNLI's rows, then SNLI's), as the paper's 942,854 training
      pairs are; a row labelled "-" (SNLI's mark for pairs without a gold label) is skipped
      and reported in `GlueSplit.skipped`. Every split of both is labelled, the test sets
      included, so do_predict scores them too. KorSTS's columns are genre, filename, year,
      id, score, sentence1, sentence2.
  (5) NSMC (Naver sentiment movie corpus, github.com/e9t/nsmc): columns id, document,
      label (0 negative, 1 positive). It has no dev set: its test set, the one Korean BERTs
      report accuracy on, is read for do_eval and do_predict. A few of its reviews are
      empty; they are kept (packed [CLS] [SEP]), as Google's reader keeps an empty text.

KLUE (Park et al. 2021; github.com/KLUE-benchmark/KLUE, klue_benchmark/): JSON files, each
a list of examples; fields by key. Its test sets are not public, so "test" (do_predict)
reads the dev file too, labelled and scored.

  task            files (under --data_dir)             text_a     text_b      label
  klue-nli        klue-nli-v1.1_{train,dev}.json       premise    hypothesis  gold_label
  klue-sts        klue-sts-v1.1_{train,dev}.json       sentence1  sentence2   labels.real-label
  klue-ynat,      ynat-v1.1_{train,dev}.json           title      -           label
  ynat, klue-tc
  klue-re         klue-re-v1.1_{train,dev}.json        sentence,  -           label
                                                       marked (6)

    klue-nli   ["entailment", "neutral", "contradiction"] (KLUE's order)
    klue-sts   none: a regression task on the annotators' mean 0-5 score (KLUE's baseline
               trains on "real-label"; "label" is it rounded to one decimal)
    klue-ynat  ["IT과학", "경제", "사회", "생활문화", "세계", "스포츠", "정치"]
    klue-re    KLUE_RE_LABELS: "no_relation" and KLUE's 29 relations, in the order of its
               relation_list.json

--data_dir is the task's directory (klue-nli-v1.1/, ...) or klue_benchmark/ holding it.

  (6) KLUE-RE: each example is a sentence with a subject and an object entity, each
      {"word", "start_idx", "end_idx" (characters, inclusive), "type"}; the relation of the
      subject to the object is the label. The text classified is the sentence with both
      entities marked (`mark_relation_entities`) by typed punctuation markers (Zhou and
      Chen 2021, "An Improved Baseline for Sentence-level Relation Extraction"):
      "@*PER*이순신@ ... #^LOC^아산#", characters the vocabulary already has, where KLUE's
      baseline adds four new tokens (<subj> ... </obj>) to the vocabulary.

Ids (`GlueSplit.ids`, one per example): the id column above (KLUE's "guid"); where there
is none, the example's 0-based position in the split (over both of KorNLI's training
files). For GLUE test files that is the "index" (QQP: "id") column that the GLUE server
expects next to each prediction.

Reading. Files are read as Google's DataProcessor._read_tsv does: csv.reader with delimiter
"\\t" and quotechar=None, i.e. with quoting off, so one physical line is one row and a `"`
is an ordinary character; lines end at `\\n` and every `\\r` is dropped, as tf.gfile's line
reader drops it (a CRLF file reads as LF, `a\\rb` inside a row as `ab`; `_read_tsv`);
columns are picked by position, and a header row (all files but CoLA's train/dev) is
skipped, not interpreted. `classification.read_examples` differs on
purpose: it is for user files, which have a header naming the columns and follow csv quoting
(a quoted field may hold tabs or span lines). GLUE files are not csv-quoted: MNLI and QQP
texts, for instance, contain bare quotes (a sentence that starts with `"`), and csv quoting
would read everything up to the next quote, tabs and newlines included, as one field,
merging rows.

Checks. Blank lines are skipped. Unlike Google's script (which indexes whatever it finds), every
row must have the split's exact field count and a label from the label list; otherwise
`DataError` names file:line, what was found and what was expected. A missing file names
the directory and the file expected there. A split with no examples is an error too.
"""

from __future__ import annotations

import csv
import dataclasses
import os

from absl import logging

from data_prep import files, schema
from data_prep.classification import DataError, Example, load_json

SPLITS = ("train", "dev", "test")

# What Google's run_classifier.py reads for each of its flags.
SPLIT_FOR_FLAG = {"do_train": "train", "do_eval": "dev", "do_predict": "test"}

DEFAULT_XNLI_LANGUAGE = "zh"  # XnliProcessor.__init__ in Google's run_classifier.py


class TaskError(DataError):
    """`--task_name` names no task here."""


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where one split's file is and which of its columns hold what (0-based)."""

    file: str  # relative to data_dir; "{language}" is replaced for XNLI
    fields: int  # exact number of tab-separated fields per row (the header too)
    text_a: int
    text_b: int | None
    label: int | None  # None: unlabelled (GLUE test files)
    header: bool = True
    id: int | None = None  # None: the example's 0-based position
    language: int | None = None  # XNLI dev/test: keep rows whose column equals the language
    skip_malformed: bool = False  # QQP: skip (and report) rows with the wrong field count
    label_aliases: tuple[tuple[str, str], ...] = ()  # read -> label-list spelling
    more: tuple[str, ...] = ()  # further files of the split, same columns, read after `file`
    skip_labels: tuple[str, ...] = ()  # rows with these labels are skipped and reported


@dataclasses.dataclass(frozen=True)
class _JsonLayout:
    """A split of a JSON task (KLUE): a list of objects, fields by key."""

    file: str
    text_a: str
    text_b: str | None
    label: tuple[str, ...]  # key path ("labels", "real-label")
    id: str = "guid"
    more: tuple[str, ...] = ()
    entities: bool = False  # KLUE-RE: text_a is the sentence with its entities marked


@dataclasses.dataclass(frozen=True)
class GlueSplit:
    """One split read from `paths`.

    paths: the split's files, in reading order (KorNLI's training set has two); `path` the
      first.
    examples: in file order (rows of other languages left out for XNLI dev/test).
    ids: one per example, as str (see the module docstring).
    skipped: "file:line: why" for each row skipped: malformed (QQP), or without a gold label
      (KorNLI's "-").
    """

    task: str
    split: str
    paths: tuple[str, ...]
    examples: list[Example]
    ids: list[str]
    skipped: list[str]

    @property
    def path(self) -> str:
        return self.paths[0]

    def summary(self) -> str:
        text = (f"{self.task} {self.split}: {len(self.examples)} examples from "
                f"{' + '.join(self.paths)}")
        if self.skipped:
            text += f"; {_rows(len(self.skipped))} skipped (first: {self.skipped[0]})"
        return text


# KLUE-RE's relations, in the order of its relation_list.json (label id = position).
NO_RELATION = "no_relation"
KLUE_RE_LABELS = (
    NO_RELATION, "org:dissolved", "org:founded", "org:place_of_headquarters",
    "org:alternate_names", "org:member_of", "org:members",
    "org:political/religious_affiliation", "org:product", "org:founded_by",
    "org:top_members/employees", "org:number_of_employees/members", "per:date_of_birth",
    "per:date_of_death", "per:place_of_birth", "per:place_of_death", "per:place_of_residence",
    "per:origin", "per:employee_of", "per:schools_attended", "per:alternate_names",
    "per:parents", "per:children", "per:siblings", "per:spouse", "per:other_family",
    "per:colleagues", "per:product", "per:religion", "per:title")
# KLUE-RE's entity markers (module docstring, note 6): (start, end) around each entity, the
# start holding its type between the inner characters.
SUBJECT_MARKERS, OBJECT_MARKERS = ("@", "*"), ("#", "^")


def mark_relation_entities(sentence: str, subject: tuple[int, int, str],
                           object_: tuple[int, int, str]) -> str:
    """The sentence with its two entities marked: "@*TYPE*" before the subject's first
    character and "@" after its last, "#^TYPE^" and "#" around the object (characters,
    `end` inclusive, as KLUE's start_idx and end_idx). Markers go in by position, so
    entities that overlap or nest are marked too (a start before an end at one place)."""
    # (position, ends before starts there, the outer entity's start first and its end
    # last, for one span the subject's start first and its end last, text)
    inserts = []
    for order, ((start, end, kind), (outer, inner)) in enumerate(
            ((subject, SUBJECT_MARKERS), (object_, OBJECT_MARKERS))):
        inserts.append((start, 1, -end, order, f"{outer}{inner}{kind}{inner}"))
        inserts.append((end + 1, 0, -start, -order, outer))
    out, last = [], 0
    for position, _, _, _, text in sorted(inserts):
        out += [sentence[last:position], text]
        last = position
    return "".join(out + [sentence[last:]])


def relation_markers_not_in_vocabulary(tokenizer) -> list[str]:
    """The characters of KLUE-RE's entity markers that `tokenizer` (a
    `tokenization.BertTokenizer`) makes [UNK]. Google's vocabularies hold every ASCII
    punctuation character; one learned by data_prep.build_vocab holds only its corpus's
    characters, and a Korean corpus may have no "*", "#" or "^": the markers then lose the
    distinction they are there for (every character missing is the same [UNK])."""
    characters = sorted(set("".join(SUBJECT_MARKERS + OBJECT_MARKERS)))
    return [c for c, pieces in zip(characters, tokenizer.tokenize(characters))
            if schema.UNK in pieces]


_BINARY = ("0", "1")
_NLI = ("contradiction", "entailment", "neutral")
_ENTAILMENT = ("entailment", "not_entailment")


def _same(train: str, dev: str, test: str, fields: int, text_a: int, text_b: int | None,
          label: int, id_: int | None, test_fields: int, test_a: int, test_b: int | None,
          skip_malformed: bool = False) -> dict[str, _Layout]:
    """Layouts where train and dev share columns and the test file has its own."""
    common = dict(id=id_, skip_malformed=skip_malformed)
    return {
        "train": _Layout(train, fields, text_a, text_b, label, **common),
        "dev": _Layout(dev, fields, text_a, text_b, label, **common),
        "test": _Layout(test, test_fields, test_a, test_b, None, id=0,
                        skip_malformed=skip_malformed),
    }


_MNLI_TRAIN = _Layout("train.tsv", 12, 8, 9, 11, id=0)

# Where each XNLI split's file lies in its archive's own directory (XNLI-MT-1.0.zip holds
# the machine-translated training sets, XNLI-1.0.zip dev and test).
_XNLI_ARCHIVES = {"train": "XNLI-MT-1.0", "dev": "XNLI-1.0", "test": "XNLI-1.0"}
_KLUE_DIRECTORY = {"klue-nli": "klue-nli-v1.1", "klue-sts": "klue-sts-v1.1",
                   "klue-ynat": "ynat-v1.1", "klue-re": "klue-re-v1.1"}
# Where a task's files lie below the download's own root, per split: XNLI's two archives
# unpacked side by side, the KorNLUDatasets repository's KorNLI/ and KorSTS/, KLUE's
# klue_benchmark/<task>-v1.1/.
_SUBDIRECTORY = {"xnli": _XNLI_ARCHIVES,
                 "kornli": dict.fromkeys(SPLITS, "KorNLI"),
                 "korsts": dict.fromkeys(SPLITS, "KorSTS"),
                 **{name: dict.fromkeys(SPLITS, below)
                    for name, below in _KLUE_DIRECTORY.items()}}


def _klue(name: str, text_a: str, text_b: str | None, label: tuple[str, ...],
          entities: bool = False) -> dict[str, _JsonLayout]:
    """KLUE's train and dev files; "test" is the dev file (KLUE's test sets are not public)."""
    train = _JsonLayout(f"{_KLUE_DIRECTORY[name]}_train.json", text_a, text_b, label,
                        entities=entities)
    dev = dataclasses.replace(train, file=f"{_KLUE_DIRECTORY[name]}_dev.json")
    return {"train": train, "dev": dev, "test": dev}
_XNLI = {
    "train": _Layout("multinli/multinli.train.{language}.tsv", 3, 0, 1, 2,
                     label_aliases=(("contradictory", "contradiction"),)),
    "dev": _Layout("xnli.dev.tsv", 19, 6, 7, 1, id=9, language=0),
    "test": _Layout("xnli.test.tsv", 19, 6, 7, 1, id=9, language=0),
}

# name -> (label list, layouts per split)
_TASKS: dict[str, tuple[tuple[str, ...], dict[str, _Layout]]] = {
    "cola": (_BINARY, {
        "train": _Layout("train.tsv", 4, 3, None, 1, header=False),
        "dev": _Layout("dev.tsv", 4, 3, None, 1, header=False),
        "test": _Layout("test.tsv", 2, 1, None, None, id=0),
    }),
    "sst-2": (_BINARY, _same("train.tsv", "dev.tsv", "test.tsv", 2, 0, None, 1, None, 2, 1, None)),
    "mrpc": (_BINARY, _same("train.tsv", "dev.tsv", "test.tsv", 5, 3, 4, 0, None, 5, 3, 4)),
    "qqp": (_BINARY, _same("train.tsv", "dev.tsv", "test.tsv", 6, 3, 4, 5, 0, 3, 1, 2,
                           skip_malformed=True)),
    "mnli": (_NLI, {
        "train": _MNLI_TRAIN,
        "dev": _Layout("dev_matched.tsv", 16, 8, 9, 15, id=0),
        "test": _Layout("test_matched.tsv", 10, 8, 9, None, id=0),
    }),
    "mnli-mm": (_NLI, {
        "train": _MNLI_TRAIN,
        "dev": _Layout("dev_mismatched.tsv", 16, 8, 9, 15, id=0),
        "test": _Layout("test_mismatched.tsv", 10, 8, 9, None, id=0),
    }),
    "qnli": (_ENTAILMENT, _same("train.tsv", "dev.tsv", "test.tsv", 4, 1, 2, 3, 0, 3, 1, 2)),
    "rte": (_ENTAILMENT, _same("train.tsv", "dev.tsv", "test.tsv", 4, 1, 2, 3, 0, 3, 1, 2)),
    "wnli": (_BINARY, _same("train.tsv", "dev.tsv", "test.tsv", 4, 1, 2, 3, 0, 3, 1, 2)),
    "xnli": (_NLI, _XNLI),
    "sts-b": (None, _same("train.tsv", "dev.tsv", "test.tsv", 10, 7, 8, 9, 0, 9, 7, 8)),
    # Kakao Brain's KorNLUDatasets: machine-translated SNLI + MNLI to train on, XNLI's dev and
    # test sets translated by hand; all labelled.
    "kornli": (_NLI, {
        "train": _Layout("multinli.train.ko.tsv", 3, 0, 1, 2,
                         more=("snli_1.0_train.ko.tsv",), skip_labels=("-",)),
        "dev": _Layout("xnli.dev.ko.tsv", 3, 0, 1, 2),
        "test": _Layout("xnli.test.ko.tsv", 3, 0, 1, 2),
    }),
    "korsts": (None, {split: _Layout(f"sts-{split}.tsv", 7, 5, 6, 4) for split in SPLITS}),
    # Naver's movie-review sentiment (github.com/e9t/nsmc): no dev set; its test set is the
    # one Korean BERTs report, so it serves do_eval and do_predict alike.
    "nsmc": (_BINARY, {"train": _Layout("ratings_train.txt", 3, 1, None, 2, id=0),
                       "dev": _Layout("ratings_test.txt", 3, 1, None, 2, id=0),
                       "test": _Layout("ratings_test.txt", 3, 1, None, 2, id=0)}),
    "klue-nli": (("entailment", "neutral", "contradiction"),
                 _klue("klue-nli", "premise", "hypothesis", ("gold_label",))),
    "klue-sts": (None, _klue("klue-sts", "sentence1", "sentence2", ("labels", "real-label"))),
    "klue-ynat": (("IT과학", "경제", "사회", "생활문화", "세계", "스포츠", "정치"),
                  _klue("klue-ynat", "title", None, ("label",))),
    "klue-re": (KLUE_RE_LABELS, _klue("klue-re", "sentence", None, ("label",), entities=True)),
}

_ALIASES = {"sst2": "sst-2", "stsb": "sts-b", "ynat": "klue-ynat", "klue-tc": "klue-ynat"}

TASKS = tuple(sorted(_TASKS))


class GlueProcessor:
    """Reads one task's splits from a data directory; see the module docstring for layouts."""

    def __init__(self, name: str, language: str | None = None):
        self.name = name
        self.language = language  # XNLI only; None for the other tasks
        label_list, self._layouts = _TASKS[name]
        self._labels = None if label_list is None else list(label_list)

    def __repr__(self) -> str:
        language = f", language={self.language!r}" if self.language else ""
        return f"GlueProcessor({self.name!r}{language})"

    def labels(self) -> list[str] | None:
        """The label list in Google's order (label id = position); None for a regression
        task (STS-B), whose label is a number."""
        return None if self._labels is None else list(self._labels)

    def is_regression(self) -> bool:
        """Whether the label is a number (STS-B's 0-5 similarity), not a class."""
        return self._labels is None

    def is_pair(self) -> bool:
        """Whether examples have a text_b (sentence-pair task)."""
        return self._layouts["train"].text_b is not None

    def file(self, split: str) -> str:
        """The file a split is read from, relative to data_dir (e.g. "dev_matched.tsv"); the
        first of them where there are several (`files`)."""
        return self.files(split)[0]

    def files(self, split: str) -> tuple[str, ...]:
        """Every file a split is read from, in reading order, relative to data_dir."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}. Received: {split!r}")
        layout = self._layouts[split]
        return tuple(name.format(language=self.language) for name in (layout.file, *layout.more))

    def path(self, data_dir: str, split: str) -> str:
        """The split's (first) file: os.path.join(data_dir, self.file(split)); where that is
        missing and the download's own subdirectory holds it (XNLI's archives unpacked side
        by side, KorNLUDatasets' KorNLI/ and KorSTS/), that one."""
        return self._paths(data_dir, split)[0]

    def _paths(self, data_dir: str, split: str) -> list[str]:
        paths = [os.path.join(data_dir, name) for name in self.files(split)]
        below = _SUBDIRECTORY.get(self.name, {}).get(split)
        if below and not os.path.isfile(paths[0]):
            unpacked = [os.path.join(data_dir, below, name) for name in self.files(split)]
            if os.path.isfile(unpacked[0]):
                return unpacked
        return paths

    def load(self, data_dir: str, split: str) -> GlueSplit:
        """Reads a split ("train", "dev" or "test") from `data_dir`.

        Raises:
          DataError: missing directory or file; a row with the wrong field count (except the
            rows QQP skips), a label not in `labels()`, no examples; file:line named.
        """
        if not os.path.isdir(data_dir):
            raise DataError(f"{data_dir}: --data_dir is not a directory (task {self.name} "
                            f"reads {' and '.join(self.files(split))} there for the {split} "
                            "set)")
        paths = self._paths(data_dir, split)
        for name, path in zip(self.files(split), paths):
            if not (os.path.isfile(path) or files.is_pipe(path)):  # a FIFO: read once
                raise DataError(self._missing(data_dir, split, name, path))
        layout = self._layouts[split]
        examples, ids, skipped = [], [], []
        for path in paths:
            if isinstance(layout, _JsonLayout):
                self._read_json(path, split, layout, examples, ids)
            else:
                self._read(path, split, layout, examples, ids, skipped)
        return GlueSplit(self.name, split, tuple(paths), examples, ids, skipped)

    def _missing(self, data_dir: str, split: str, name: str, path: str) -> str:
        shown = os.path.dirname(path)
        if not os.path.isdir(shown):  # a subdirectory (XNLI's multinli/): list data_dir
            shown = data_dir
        below = _SUBDIRECTORY.get(self.name, {}).get(split)
        also = f" or {os.path.join(data_dir, below, name)}" if below else ""
        layout = ""
        if self.name == "xnli" and any(n.startswith("XNLI-") for n in os.listdir(data_dir)):
            layout = (" (XNLI as Google's README lays it out: XNLI-1.0's xnli.dev.tsv and "
                      "xnli.test.tsv beside XNLI-MT-1.0's multinli/, in one directory; or "
                      "the two archives unpacked there side by side)")
        return (f"{data_dir}: no {name} there for the {self.name} {split} set (expected "
                f"{path}{also}; {shown} holds {_listing(shown)}){layout}")

    def train_examples(self, data_dir: str) -> list[Example]:
        """`load(data_dir, "train").examples`; skipped rows are logged (do_train)."""
        return self._examples(data_dir, "train")

    def dev_examples(self, data_dir: str) -> list[Example]:
        """`load(data_dir, "dev").examples`; skipped rows are logged (do_eval)."""
        return self._examples(data_dir, "dev")

    def test_examples(self, data_dir: str) -> list[Example]:
        """`load(data_dir, "test").examples`; skipped rows are logged (do_predict)."""
        return self._examples(data_dir, "test")

    def _examples(self, data_dir: str, split: str) -> list[Example]:
        loaded = self.load(data_dir, split)
        if loaded.skipped:
            logging.warning("%s", loaded.summary())
        return loaded.examples

    def _read(self, path: str, split: str, layout: _Layout, examples: list[Example],
              ids: list[str], skipped: list[str]) -> None:
        """Appends one file's examples, ids and skipped rows."""
        aliases = dict(layout.label_aliases)
        first = len(examples)
        seen_languages: set[str] = set()
        header_pending = layout.header
        for line, row in _read_tsv(path):
            where = f"{path}:{line}"
            is_header, header_pending = header_pending, False
            if len(row) != layout.fields:
                found = f"found {len(row)} fields, expected {layout.fields}"
                if layout.skip_malformed and not is_header:
                    skipped.append(f"{where}: {found}")
                    continue
                what = "header of the" if is_header else "row of the"
                raise DataError(f"{where}: {found} (tab-separated; {what} {self.name} {split} "
                                f"file {os.path.basename(path)}"
                                f"{', which has no header' if not layout.header else ''})")
            if is_header:
                continue
            if layout.language is not None:
                seen_languages.add(row[layout.language])
                if row[layout.language] != self.language:
                    continue
            label = None
            if layout.label is not None:
                label = aliases.get(row[layout.label], row[layout.label])
                if label in layout.skip_labels:
                    skipped.append(f"{where}: label {label!r}, no gold label")
                    continue
                if self._labels is None:
                    try:
                        float(label)
                    except ValueError:
                        raise DataError(f"{where}: label {label!r} (column {layout.label}) is "
                                        f"not a number ({self.name} is a regression task)"
                                        ) from None
                elif label not in self._labels:
                    raise DataError(f"{where}: label {row[layout.label]!r} (column "
                                    f"{layout.label}) is not one of {self._labels}")
            text_b = row[layout.text_b] if layout.text_b is not None else None
            ids.append(row[layout.id] if layout.id is not None else str(len(examples)))
            examples.append(Example(where, row[layout.text_a], text_b, label))
        if len(examples) == first:
            if layout.language is not None and seen_languages:
                raise DataError(f"{path}: no rows for language {self.language!r} (column "
                                f"{layout.language}; languages there: {sorted(seen_languages)})")
            raise DataError(f"{path}: no examples for the {self.name} {split} set"
                            + (f" ({_rows(len(skipped))} skipped)" if skipped else ""))


    def _read_json(self, path: str, split: str, layout: _JsonLayout,
                   examples: list[Example], ids: list[str]) -> None:
        """Appends one KLUE file's examples and ids (their "guid")."""
        rows = load_json(path)
        if not isinstance(rows, list):
            raise DataError(f"{path}: expected a JSON list of examples (the {self.name} "
                            f"{split} file), got a JSON {type(rows).__name__}")
        keys = [key for key in (layout.id, layout.text_a, layout.text_b) if key]
        unlike = []  # KLUE-RE: entities whose "word" is not their characters
        for i, row in enumerate(rows):
            where = f"{path}[{i}]"
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected an object, got {type(row).__name__}")
            for key in keys:
                if not isinstance(row.get(key), str):
                    found = "no such field" if key not in row else type(row[key]).__name__
                    raise DataError(f"{where}.{key}: expected a string ({found})")
            label = row
            for depth, key in enumerate(layout.label):
                if not isinstance(label, dict) or key not in label:
                    raise DataError(f"{where}.{'.'.join(layout.label[:depth + 1])}: "
                                    "expected a field here (the label)")
                label = label[key]
            field = ".".join(layout.label)
            if self._labels is None:
                if isinstance(label, bool) or not isinstance(label, (int, float)):
                    raise DataError(f"{where}.{field}: label {label!r} is not a number "
                                    f"({self.name} is a regression task)")
                label = repr(float(label))
            elif label not in self._labels:
                raise DataError(f"{where}.{field}: label {label!r} is not one of "
                                f"{self._labels}")
            text_a = row[layout.text_a]
            if layout.entities:
                subject, obj = (_entity(row, key, where)
                                for key in ("subject_entity", "object_entity"))
                text_a = mark_relation_entities(text_a, subject, obj)
                unlike.extend(_word_unlike_its_span(row, key, where)
                              for key in ("subject_entity", "object_entity"))
            ids.append(row[layout.id])
            examples.append(Example(where, text_a,
                                    row[layout.text_b] if layout.text_b else None, label))
        if not rows:
            raise DataError(f"{path}: no examples for the {self.name} {split} set")
        unlike = [u for u in unlike if u]
        if unlike:
            logging.warning("%s: %d entities' \"word\" differs from the sentence's characters "
                            "start_idx..end_idx (first: %s); they are marked by the indices, "
                            "as KLUE's baseline marks them", path, len(unlike), unlike[0])


def _word_unlike_its_span(row: dict, key: str, where: str) -> str | None:
    """Where KLUE-RE's `key` entity has a "word" other than its characters in the sentence
    (checked by `_entity`), "where.key: 'word' vs 'characters'"; else None."""
    entity = row[key]
    word = entity.get("word")
    span = row["sentence"][entity["start_idx"]:entity["end_idx"] + 1]
    if isinstance(word, str) and word != span:
        return f"{where}.{key}: {word!r} vs {span!r}"
    return None


def _entity(row: dict, key: str, where: str) -> tuple[int, int, str]:
    """(start, end, type) of KLUE-RE's `key` entity, checked against its sentence."""
    entity = row.get(key)
    if not isinstance(entity, dict):
        raise DataError(f"{where}.{key}: expected an object with start_idx, end_idx and type")
    start, end, kind = (entity.get(k) for k in ("start_idx", "end_idx", "type"))
    sentence = row["sentence"]
    for name, value in (("start_idx", start), ("end_idx", end)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise DataError(f"{where}.{key}.{name}: expected an integer, got {value!r}")
    if not 0 <= start <= end < len(sentence):
        raise DataError(f"{where}.{key}: characters {start}-{end} are not in the "
                        f"{len(sentence)}-character sentence (end_idx is inclusive)")
    if not isinstance(kind, str) or not kind.strip():
        raise DataError(f"{where}.{key}.type: expected the entity type (PER, ORG, ...), got "
                        f"{kind!r}")
    return start, end, kind.strip()


def _rows(count: int) -> str:
    return f"{count} row{'' if count == 1 else 's'}"


def _listing(directory: str, limit: int = 12) -> str:
    if not os.path.isdir(directory):
        return "nothing: it does not exist"
    names = sorted(os.listdir(directory))
    if not names:
        return "nothing"
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} entries)" if len(names) > limit else "")


def _read_tsv(path: str):
    """Yields (line number, fields) per non-blank line; Google's _read_tsv, quoting off.

    Lines are those of Google's reader (csv.reader over tf.gfile's line iteration): they end
    at "\\n" only and every "\\r" is dropped, so a CRLF file reads as LF, a cell edited into
    "text\\r" reads "text", and "a\\rb" inside a row reads "ab" (the row stays whole; split
    there, as Python's universal newlines and transformers' reader split it, it would lose
    fields or be skipped). A file whose lines all end in a lone "\\r" (classic Mac OS), one
    line to Google's reader, is split at them.

    Raises:
      files.TextFileError: the file is not UTF-8 text (NUL bytes, UTF-16, cp949, ...),
        naming the line and byte, as every reader does.
    """
    # A pipe is read once, into a temporary copy (`files.rereadable`): the text check and
    # the line-end sniff would otherwise drain it and leave the read nothing.
    with files.rereadable(path) as source:
        yield from _read_tsv_rows(source, path)


def _read_tsv_rows(source: str, path: str):
    """`_read_tsv` of the file `source`, named `path` in messages."""
    files.check_text_file(source, name=path)
    newline = files.newline_for(source)
    with files.open_input(source, newline=newline) as f:
        lines = f if newline == "" else (line.replace("\r", "") for line in f)
        reader = csv.reader(lines, delimiter="\t", quotechar=None)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                raise DataError(f"{path}:{reader.line_num}: {e}") from None
            if not row or (len(row) == 1 and not row[0].strip()):
                continue  # blank line
            yield reader.line_num, row


def canonical_task_name(task_name: str) -> str:
    """The registry name for a `--task_name` (case-insensitive; sst2 -> sst-2).

    Raises:
      TaskError: unknown task.
    """
    name = task_name.strip().lower()
    name = _ALIASES.get(name, name)
    if name not in _TASKS:
        raise TaskError(f"--task_name: unknown task {task_name!r}; known tasks: "
                        f"{', '.join(TASKS)} (case-insensitive; sst2 = sst-2, stsb = sts-b, "
                        "ynat = klue-tc = klue-ynat)")
    return name


def get_processor(task_name: str, language: str = DEFAULT_XNLI_LANGUAGE) -> GlueProcessor:
    """The processor for `--task_name` (Google's `processors[task_name.lower()]()`).

    Args:
      task_name: cola, klue-nli, klue-sts, klue-ynat (ynat, klue-tc), kornli, korsts, mnli,
        mnli-mm, mrpc, nsmc, qnli, qqp, rte, sst-2 (sst2), sts-b (stsb), wnli, xnli; any case.
      language: XNLI's language (Google hard-codes "zh"); ignored by the other tasks.

    Raises:
      TaskError: unknown task, or an XNLI language that is not a plain name.
    """
    name = canonical_task_name(task_name)
    if name != "xnli":
        return GlueProcessor(name)
    if not language or os.sep in language or "/" in language or language.startswith("."):
        raise TaskError(f"--xnli_language must be a language code such as 'zh' or 'de'. "
                        f"Received: {language!r}")
    return GlueProcessor(name, language)
