r"""Proves an export: loads it in a clean process and checks what a server will rely on.

    python -m export.verify --export_dir=/models/bert_encoder/1 \
        [--init_checkpoint=CKPT [--bert_config_file=...]] [--rtol=1e-4]

--export_dir may also name the model's base directory (/models/bert_encoder, as the export
tools' --export_dir does): its highest version is checked, the one TF Serving serves. A
remote one (gs://) is checked on a local copy of that version (the load check's process
could not see every remote file system), and reported under the path given.

Checks, each reported on one line; exit status 1 if any fails:
  ops        every op is core TensorFlow or in stock TF Serving's tensorflow-text 2.12.1
  load       a fresh Python process importing only tensorflow (+ tensorflow_text when the
             graph holds text ops) loads the SavedModel; no project code is imported
  signatures the signatures of the export's kind, told by marks only its exporter writes (a
             signature or an input or output name; an export with the marks of several
             kinds fails): the encoder's, preprocessor's, classifier's and regressor's
             names, dtypes and ranks and serve_examples' method; the tagger's (words in
             or characters in, export_tagger) and span QA's every signature, input and
             output by name, dtype and shape (TAGGER_SIGNATURES, SPAN_QA_SIGNATURES)
  warmup     assets.extra/tf_serving_warmup_requests parses as PredictionLog records and
             every request runs, with finite outputs
  lengths    ids in (encoder): the longest warmup request fits the position table
             (max_position_embeddings of assets/bert_config.json). Text in (classifier,
             regressor, tagger, span QA): the length buckets the first line of
             batching_params.pbtxt names, the last the serving length (the exporter's
             max_seq_length); that length and any ids warmup request fit the position
             table (the rows of the saved embeddings/position_embeddings variable), span
             QA's outputs are that wide, and each bucketed signature has a warmup request
             that runs the encoder at every bucket (counted with the export's
             assets/vocab.txt and tokenizer_config.json; span QA's from the request's
             outputs, as its question is cut to a max_query_length the export does not
             record); without batching_params.pbtxt (an export from before length
             buckets) the line passes, saying it was not checked
  session    the TF1 session loader (TF Serving's C++ loader and `saved_model_cli run`
             take this path) restores the variables, and the same requests give the
             same outputs by SignatureDef tensor names (within tolerance)
  parity     with --init_checkpoint, for an encoder export: its outputs (pooled, sequence,
             every layer's, and mlm_logits where the export has the mlm signature and the
             checkpoint the heads) equal the Keras model's from that checkpoint (within
             tolerance); a text-in export is refused

Tolerance (session and parity): every float output must satisfy
    max |got - expected| <= rtol * max |expected|
per output tensor, i.e. relative to the output's own scale, with rtol = 1e-4 (--rtol); the
-10000 the text-in exports write at padding positions is not part of a scale
(`serving_probe.difference`).
The same float32 graph run by another runtime (TF1 session vs TF2 function, Keras vs the
traced export) rounds differently, and the differences grow with the weights' magnitudes
and the depth: random-initialized models of any size here agree bit for bit, while the
real MiniLM-L6 weights (outputs up to 10.5) differ by up to 2.0e-05 (1.9e-06 of the scale),
growing from 2e-06 after layer 1 to 2e-05 after layer 5, most at padded positions. A fixed
absolute tolerance of 1e-05 therefore failed correct exports of real models, and would more
so for larger ones: a base-size model with trained-like weights (nonzero biases, spread
LayerNorm parameters) differs by 5.9e-06 of the scale, a large-size one by 1.4e-05 (its
pooled output). 1e-4 leaves a margin of 7x over that and 50x over MiniLM, and stays below
what a wrong weight does: one weight tensor off by 0.1% moves MiniLM's outputs by 1.7e-4 to
4e-4 of their scale (1% by 1.7e-3 to 4e-3; a bfloat16 round trip of it by 3e-4 to 1e-3), a
transposed, swapped or missing tensor by O(1). A single element moved by 1e-2 moves them by
6e-06 to 2e-03 depending on where it sits: below 1e-4 it cannot be told from the rounding
differences of a correct large export, by any tolerance.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from export import keras_backend

# Run as a program: Keras on TensorFlow whatever KERAS_BACKEND says (before TF imports it).
_ENVIRONMENT_BACKEND = keras_backend.use_tensorflow() if __name__ == "__main__" else None

import numpy as np
from absl import app, flags, logging

from data_prep import tf_logging

tf_logging.import_tensorflow()  # without TensorFlow's C++ start-up notices
from data_prep import files, schema  # noqa: E402
from export.saved_model_writer import WARMUP_FILE, served_version

# What a TF Hub BERT encoder signature must look like.
ENCODER_INPUTS = schema.MODEL_INPUT_NAMES
ENCODER_OUTPUTS = ("pooled_output", "sequence_output", "encoder_outputs", "default")

# The signatures of the tagger and span-QA exports (export_tagger, export_span_qa): name ->
# (inputs, outputs), each input or output name -> (dtype, shape). In a shape None is a
# dimension of any size (the batch, the words, ...) and a letter a fixed size the export
# chose, the same wherever the letter appears: C the tagger's tags, S span QA's
# max_seq_length.
_TEXT = {"text": ("string", (None,))}
_TAGGER_OUTPUTS = {
    "words": ("string", (None, None)), "tags": ("string", (None, None)),
    "tag_ids": ("int32", (None, None)), "probabilities": ("float32", (None, None, "C")),
    "num_words": ("int32", (None,)),
}
TAGGER_SIGNATURES = {"serving_default": (_TEXT, _TAGGER_OUTPUTS),
                     "words": ({"words": ("string", (None, None))}, _TAGGER_OUTPUTS)}
# A tagger fine-tuned on character-tagged data (export_tagger --tag_format=klue).
CHARACTER_TAGGER_SIGNATURES = {"serving_default": (_TEXT, {
    "units": ("string", (None, None)), "unit_starts": ("int32", (None, None)),
    "unit_ends": ("int32", (None, None)), "tags": ("string", (None, None)),
    "tag_ids": ("int32", (None, None)), "probabilities": ("float32", (None, None, "C")),
    "num_units": ("int32", (None,)), "entities": ("string", (None, None)),
    "entity_types": ("string", (None, None)), "entity_starts": ("int32", (None, None)),
    "entity_ends": ("int32", (None, None)), "num_entities": ("int32", (None,)),
})}
SPAN_QA_SIGNATURES = {
    "serving_default": ({"question": ("string", (None,)), "context": ("string", (None,))}, {
        "start_logits": ("float32", (None, "S")), "end_logits": ("float32", (None, "S")),
        "input_word_ids": ("int32", (None, "S")), "input_type_ids": ("int32", (None, "S")),
        **{name: ("int32", (None,)) for name in (
            "window_start", "windows", "answer_start", "answer_end", "answer_char_start",
            "answer_char_end")},
        "null_odds": ("float32", (None,)), "answer": ("string", (None,)),
    }),
    "ids": ({name: ("int32", (None, None)) for name in ENCODER_INPUTS},
            {"start_logits": ("float32", (None, None)), "end_logits": ("float32", (None, None))}),
}

# The signatures of a text-in export that run the encoder at a length bucket
# (export.length_buckets), by kind; the exporters write a warmup request for every bucket
# on each of them (those the export has: pair only where the model reads pairs).
BUCKETED_SIGNATURES = {
    "classifier": ("serving_default", "pair", "serve_examples"),
    "regressor": ("serving_default", "pair", "serve_examples"),
    "tagger": ("serving_default", "words"),
    "span_qa": ("serving_default",),
}

# Session and parity checks: max |got - expected| <= RTOL * max |expected| per output
# (module docstring for the figures behind it).
RTOL = 1e-4


def within_tolerance(diff: float, scale: float, rtol: float = RTOL) -> bool:
    """Whether an output's largest difference is within `rtol` of its scale (max |x|)."""
    return diff <= rtol * scale


def _describe(diff: float, scale: float, output: str, rtol: float) -> str:
    relative = f"{diff / scale:.1e}" if scale > 0 else ("0" if diff == 0 else "inf")
    return (f"{diff:.1e} = {relative} x the scale of {output} (max |x| {scale:.3g}; "
            f"tolerance {rtol:g} x scale)")


class VerifyError(ValueError):
    """--export_dir is not a SavedModel directory (missing, or saved_model.pb unreadable)."""


@dataclass
class Report:
    export_dir: str
    lines: list[tuple[str, bool, str]] = field(default_factory=list)

    def add(self, check: str, ok: bool, detail: str) -> bool:
        self.lines.append((check, ok, detail))
        return ok

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.lines)

    def __str__(self):
        rows = [f"verify {self.export_dir}"]
        rows += [f"  [{'ok' if ok else 'FAIL'}] {check:<10} {detail}" for check, ok, detail in self.lines]
        rows.append("  result: " + ("PASS" if self.ok else "FAIL"))
        return "\n".join(rows)


def _site_dirs() -> set[str]:
    """This interpreter's site-packages directories (where an installed copy lives)."""
    import site

    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    dirs.append(site.getusersitepackages())
    return {os.path.abspath(d) for d in dirs}


def _run_probe(export_dir, text, inputs=None, timeout=600):
    """Runs export.serving_probe in a fresh interpreter; returns (report, outputs|None).

    With `text` (the graph holds text ops) the report's "warmup_outputs" lists each warmup
    request's numeric outputs, {name: array}, in the file's order (`_check_bucket_lengths`
    reads span QA's)."""
    # TensorFlow's loader globs the variables' path: "run [1]/" is loaded through an alias.
    with tempfile.TemporaryDirectory() as tmp, files.glob_free(export_dir) as loadable:
        report_file = os.path.join(tmp, "report.json")
        cmd = [sys.executable, "-m", "export.serving_probe", loadable, report_file]
        warmup_file = os.path.join(tmp, "warmup_outputs.npz")
        if text:
            cmd += ["--text", "--warmup_outputs", warmup_file]
        outputs_file = os.path.join(tmp, "outputs.npz")
        if inputs is not None:
            inputs_file = os.path.join(tmp, "inputs.npz")
            np.savez(inputs_file, **inputs)
            cmd += ["--inputs", inputs_file, outputs_file]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        if root not in _site_dirs():
            # Run from a clone: the child finds export.serving_probe there. An installed
            # copy's root is site-packages, which the child has already, and which on
            # PYTHONPATH would come before the standard library.
            env["PYTHONPATH"] = root + os.pathsep + os.environ.get("PYTHONPATH", "")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0:
            # The probe's last line is the error (a damaged file: DecodeError, OpError, ...);
            # the frames above it are TensorFlow's, not the user's business.
            lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
            last = lines[-1] if lines else f"exit status {proc.returncode}"
            raise RuntimeError(f"the export did not load in a fresh process: {last}")
        report = files.read_json(report_file)
        outputs = dict(np.load(outputs_file)) if inputs is not None else None
        if text:
            report["warmup_outputs"] = [{} for _ in report["warmup"]]
            for key, value in np.load(warmup_file).items():  # "i/name"
                i, name = key.split("/", 1)
                report["warmup_outputs"][int(i)][name] = value
    return report, outputs


def _check_variables_index(export_dir: str) -> None:
    """A damaged variables/variables.index is one line naming it (the probe's loader would
    fail on it with TensorFlow's frames); the data file is read by the probe itself."""
    import tensorflow as tf

    from data_prep.cli import reading

    prefix = os.path.join(export_dir, "variables", "variables")
    if os.path.exists(prefix + ".index"):
        with reading(prefix + ".index", "a TensorFlow checkpoint index (the export's variables)"
                     ), files.glob_free(prefix) as readable:
            tf.train.load_checkpoint(readable)


def _position_table(export_dir: str) -> tuple[int, str] | None:
    """The longest input the export's encoder takes, and where the export records it:
    max_position_embeddings of assets/bert_config.json (the encoder export's), else the rows
    of the position-embedding variable the SavedModel saves (the text-in exports hold no
    config); None where neither is there.

    Raises:
      ValueError: the config's value is not an integer.
    """
    from export.saved_model_writer import variable_shapes

    config_path = os.path.join(export_dir, "assets", "bert_config.json")
    if os.path.exists(config_path):
        positions = files.read_json(config_path).get("max_position_embeddings")
        if isinstance(positions, bool) or not isinstance(positions, int):
            raise ValueError(f"{config_path}: no integer max_position_embeddings")
        return positions, "max_position_embeddings"
    from bert_keras.checkpoints import EMBEDDING_WEIGHTS

    name = next(w.ours for w in EMBEDDING_WEIGHTS if w.ours.endswith("/position_embeddings"))
    rows = [shape[0] for variable, shape in variable_shapes(export_dir).items()
            if (variable == name or variable.endswith("/" + name)) and len(shape) == 2]
    return (min(rows), f"rows of {name}") if rows else None


def _check_lengths(report: Report, export_dir: str, warmup: list[dict]) -> None:
    """The longest input the export accepts (its position table, `_position_table`) against
    its warmup requests of ids: a warmup longer than the table would fail in TF Serving,
    and a warmup shorter than the serving length leaves the longest requests unwarmed.
    No line where no warmup request holds ids or the export records no table."""
    lengths = [shape[1] for w in warmup for group in ("inputs", "outputs")
               for name, shape in w[group].items() if name == "input_word_ids" and len(shape) > 1]
    if not lengths:
        return
    try:
        table = _position_table(export_dir)
    except ValueError as e:
        report.add("lengths", False, str(e))
        return
    if table is None:
        return
    positions, source = table
    longest = max(lengths)
    report.add("lengths", longest <= positions,
               f"longest accepted input {positions} WordPieces ({source}); "
               f"warmup requests of up to {longest}"
               + ("" if longest <= positions else ": longer than the position table"))


def _export_tokenizer(export_dir: str):
    """The tokenizer a text-in export packs with: its assets/vocab.txt, with the settings of
    the assets/tokenizer_config.json beside it (what the export tools write there)."""
    from data_prep import files, tokenizer_config
    from data_prep.tokenization import BertTokenizer

    vocab = os.path.join(export_dir, "assets", files.VOCAB_FILE)
    return BertTokenizer.from_config(vocab, tokenizer_config.resolve(vocab)[0])


def _packed_lengths(kind: str, characters: bool, name: str, inputs: dict, outputs: dict,
                    tokenizer, seq_length: int) -> list[int] | None:
    """The length each row of one warmup request of signature `name` is packed to before
    the encoder ([CLS], the texts' WordPieces, a [SEP] after each; at most `seq_length`),
    as the exporter packs it; None for a signature that runs the length it is sent (span
    QA's ids).

    Span QA's is read from the request's outputs (numpy arrays): a row of several windows
    filled its first window (`seq_length`), one of one window ran its real positions, those
    whose start logit is not the padding fill; its question is cut to a
    --max_query_length that the export does not record. The others are counted with
    `tokenizer`: a classifier's texts, the tagger's words each on its own (a word of no
    WordPiece is one [UNK]), a character tagger's whole text; windows and truncation keep
    a row to `seq_length`.
    """
    from export.length_buckets import PADDING_LOGIT

    def pieces(texts):  # bytes -> WordPieces each
        return [len(ids) for ids in tokenizer.encode(list(texts))] if len(texts) else []

    if kind == "span_qa":
        if name != "serving_default" or not {"windows", "start_logits"} <= set(outputs):
            return None
        if outputs["windows"].size and outputs["windows"].max() > 1:
            return [seq_length]
        return [int(n) for n in (outputs["start_logits"] != PADDING_LOGIT).sum(axis=1)]
    if kind == "tagger":
        if characters:
            return [min(n, seq_length - 2) + 2 for n in pieces(inputs["text"])]
        if name == "words":  # rows padded at the end with "", as the signature strips them
            rows = [list(row) for row in inputs["words"]]
            for row in rows:
                while row and row[-1] == b"":
                    row.pop()
        else:  # Python's str.split(), as the text signature splits (export_tagger)
            rows = [[w.encode("utf-8", "surrogateescape")
                     for w in t.decode("utf-8", "surrogateescape").split()]
                    for t in inputs["text"]]
        return [min(sum(max(n, 1) for n in pieces(row)), seq_length - 2) + 2 for row in rows]
    if name == "serve_examples":
        import tensorflow as tf

        rows = []
        for serialized in inputs["inputs"]:
            feature = tf.train.Example.FromString(serialized).features.feature
            rows.append([feature[k].bytes_list.value[0] for k in ("text", "text_b")
                         if k in feature])
    elif name == "pair":
        rows = list(zip(inputs["text_a"], inputs["text_b"]))
    else:
        rows = [[t] for t in inputs["text"]]
    return [min(1 + len(row) + sum(pieces(row)), seq_length) for row in rows]


def _check_bucket_lengths(report: Report, export_dir: str, kind: str, signatures: dict,
                          sizes: dict, probe: dict) -> None:
    """A text-in export's lengths, one "lengths" line: its serving length (the last of the
    length buckets its batching_params.pbtxt names, `batching_parameters.recorded_buckets`)
    and its ids warmup requests fit the position table (`_position_table`), span QA's
    outputs are that wide, and the warmup requests of every bucketed signature
    (BUCKETED_SIGNATURES) run the encoder at every bucket: TF Serving serves the first
    request of an unwarmed length unwarmed."""
    from export import batching_parameters
    from export.saved_model_writer import read_warmup_requests

    params = os.path.join(export_dir, batching_parameters.PER_MODEL_FILE)
    buckets = None
    if os.path.exists(params):
        with open(params, encoding="utf-8", errors="replace") as f:
            buckets = batching_parameters.recorded_buckets(f.read())
    if buckets is None and not os.path.exists(params):
        # Not needed to serve (TF Serving batches without it): an export written before
        # length buckets, or by hand, is not failed for lacking it; the line says so.
        report.add("lengths", True, f"not checked: no {params} (the export tools write it "
                   "with the length buckets; export/batching_parameters.py), so the serving "
                   "length and the warmup's coverage are unknown")
        return
    if buckets is None:
        report.add("lengths", False, f"{params}: its first line does not name the export's "
                   "length buckets (export/batching_parameters.py), so its serving length "
                   "and the warmup's coverage cannot be checked")
        return
    seq_length = buckets[-1]
    problems = []
    if sizes.get("S", seq_length) != seq_length:
        problems.append(f"serving_default's outputs are {sizes['S']} positions wide, "
                        f"{batching_parameters.PER_MODEL_FILE} names max_seq_length {seq_length}")
    ids = [shape[1] for w in probe["warmup"] for name, shape in w["inputs"].items()
           if name == "input_word_ids" and len(shape) > 1]
    longest = max([seq_length, *ids])
    try:
        positions, source = _position_table(export_dir) or (None, None)
    except ValueError as e:
        problems.append(str(e))
        positions = source = None
    if positions is None and not problems:
        problems.append("no assets/bert_config.json and no position-embedding variable: the "
                        "export records no position table to check its serving length against")
    elif positions is not None and longest > positions:
        problems.append(f"the longest input, {longest} WordPieces (serving length {seq_length}"
                        + (f"; ids warmup requests of up to {max(ids)}" if ids else "")
                        + f"), is longer than the position table ({positions}, {source})")
    characters = _reads_characters(signatures)
    bucketed = [n for n in BUCKETED_SIGNATURES[kind] if n in signatures]
    runs = {}
    try:
        tokenizer = None if kind == "span_qa" else _export_tokenizer(export_dir)
        requests = read_warmup_requests(os.path.join(export_dir, WARMUP_FILE))
        # Where the graph holds no text ops the probe saved no outputs (a text-in export
        # always holds them; span QA's rows are then not counted).
        outputs_of = probe.get("warmup_outputs") or [{} for _ in requests]
        for (name, inputs), outputs in zip(requests, outputs_of):
            rows = _packed_lengths(kind, characters, name, inputs, outputs, tokenizer,
                                   seq_length)
            if rows:
                runs.setdefault(name, set()).add(
                    min((b for b in buckets if b >= max(rows)), default=seq_length))
    except (OSError, ValueError) as e:  # the tokenizer's files (VocabError is a ValueError)
        problems.append(f"the warmup's lengths could not be counted: {e}")
        bucketed = []
    for name in bucketed:
        missing = [str(b) for b in buckets if b not in runs.get(name, ())]
        if missing:
            problems.append(f"no {name} warmup request runs at length bucket"
                            f"{'s' if len(missing) > 1 else ''} {','.join(missing)} of "
                            f"{','.join(map(str, buckets))}: TF Serving serves the first "
                            "request of that length unwarmed")
    report.add("lengths", not problems, "; ".join(problems) or
               f"serving length {seq_length} <= {positions} positions ({source}); the warmup "
               f"runs every length bucket ({','.join(map(str, buckets))}) on "
               f"{', '.join(bucketed)}")


def _check_encoder_signature(report: Report, signature) -> bool:
    ins, outs = signature["inputs"], signature["outputs"]
    problems = [f"input {n} missing" for n in ENCODER_INPUTS if n not in ins]
    problems += [
        f"input {n} is {ins[n]['dtype']}, expected int32"
        for n in ENCODER_INPUTS if n in ins and ins[n]["dtype"] != "int32"
    ]
    problems += [f"output {n} missing" for n in ENCODER_OUTPUTS if n not in outs]
    if not problems:
        ranks = {n: len(outs[n]["shape"]) for n in ENCODER_OUTPUTS}
        expected = {"pooled_output": 2, "default": 2, "sequence_output": 3, "encoder_outputs": 4}
        problems += [f"output {n} has rank {ranks[n]}, expected {r}"
                     for n, r in expected.items() if ranks[n] != r]
    return report.add("signatures", not problems,
                      "; ".join(problems) or "encoder signature: 3 int32 inputs, 4 outputs")


def _check_preprocessor_signature(report: Report, signatures) -> bool:
    problems = []
    default = signatures["serving_default"]
    if list(default["inputs"]) != ["text"] or default["inputs"]["text"]["dtype"] != "string":
        problems.append(f"serving_default should take one string input `text`, got {default['inputs']}")
    for name in ("serving_default", "pair"):
        if name not in signatures:
            problems.append(f"no {name} signature")
            continue
        outs = signatures[name]["outputs"]
        for key in ENCODER_INPUTS:
            spec = outs.get(key)
            if spec is None or spec["dtype"] != "int32" or len(spec["shape"]) != 2:
                problems.append(f"{name} output {key} should be int32 [batch, seq], got {spec}")
    return report.add("signatures", not problems,
                      "; ".join(problems) or "preprocessor: text -> 3 int32 encoder inputs; pair")


def _serve_examples_problems(signatures, export_dir, api: str, outputs_ok, expected: str
                             ) -> list[str]:
    """What is wrong with serve_examples, the signature of TF Serving's `api` ("Classify",
    "Regress"): missing, inputs other than `inputs`, outputs `outputs_ok` refuses (described
    by `expected`), or a method other than `tensorflow/serving/<api>`."""
    from export.saved_model_writer import signature_method_names

    examples = signatures.get("serve_examples")
    if examples is None:
        return [f"no serve_examples signature (TF Serving's {api} API reads it)"]
    problems = []
    if list(examples["inputs"]) != ["inputs"] or not outputs_ok(examples["outputs"]):
        problems.append(f"serve_examples should map `inputs` to {expected}")
    method = signature_method_names(export_dir).get("serve_examples")
    wanted = f"tensorflow/serving/{api.lower()}"
    if method != wanted:
        problems.append(f"serve_examples method is {method!r}, TF Serving's {api} API needs "
                        f"{wanted!r}")
    return problems


def _check_classifier_signature(report: Report, signatures, export_dir) -> bool:
    problems = []
    outs = signatures["serving_default"]["outputs"]
    for key, dtype, rank in (("probabilities", "float32", 2), ("label", "string", 1),
                             ("label_id", "int32", 1)):
        spec = outs.get(key)
        if spec is None or spec["dtype"] != dtype or len(spec["shape"]) != rank:
            problems.append(f"serving_default output {key} should be {dtype} rank {rank}, got {spec}")
    problems += _serve_examples_problems(
        signatures, export_dir, "Classify", lambda outputs: set(outputs) == {"classes", "scores"},
        "`classes` and `scores`")
    return report.add("signatures", not problems, "; ".join(problems) or
                      "classifier: text -> probabilities/label; serve_examples for Classify")


def _check_regressor_signature(report: Report, signatures, export_dir) -> bool:
    problems = []
    spec = signatures["serving_default"]["outputs"].get("score")
    if spec is None or spec["dtype"] != "float32" or len(spec["shape"]) != 1:
        problems.append(f"serving_default output score should be float32 rank 1, got {spec}")

    def outputs_ok(outputs):
        return (list(outputs) == ["outputs"] and outputs["outputs"]["dtype"] == "float32"
                and len(outputs["outputs"]["shape"]) == 1)

    problems += _serve_examples_problems(
        signatures, export_dir, "Regress", outputs_ok,
        "float32 [batch] `outputs`, as TF Serving's Regress API reads them")
    return report.add("signatures", not problems, "; ".join(problems) or
                      "regressor: text -> score; serve_examples for Regress")


def _shape_text(shape, sizes=None) -> str:
    return "[" + ", ".join("?" if d is None else str((sizes or {}).get(d, d)) for d in shape) + "]"


def _shape_matches(want, got, sizes: dict) -> bool:
    """Whether `got` (the probe's shape: ints and None) is `want` (a table's: None, an
    int, or a letter, bound in `sizes` to the first positive size it meets)."""
    if len(want) != len(got):
        return False
    for w, g in zip(want, got):
        if w is None or isinstance(w, int):
            if g != w:
                return False
        elif not isinstance(g, int) or g < 1 or sizes.setdefault(w, g) != g:
            return False
    return True


def _signature_problems(signatures: dict, expected: dict) -> tuple[list[str], dict]:
    """Where the probe's `signatures` differ from `expected` (a table as TAGGER_SIGNATURES):
    missing or unexpected signatures, inputs and outputs, other dtypes or shapes. Returns
    (problems, the sizes the table's letters stand for)."""
    problems, sizes = [], {}
    problems += [f"unexpected signature {n}" for n in sorted(set(signatures) - set(expected))]
    for name, wanted in expected.items():
        if name not in signatures:
            problems.append(f"no {name} signature")
            continue
        for group, want in zip(("input", "output"), wanted):
            got = signatures[name][group + "s"]
            missing = [k for k in want if k not in got]
            extra = sorted(set(got) - set(want))
            if missing:
                problems.append(f"{name} has no {group} {', '.join(missing)}")
            if extra:
                problems.append(f"{name} has unexpected {group}s {', '.join(extra)}")
            for key in (k for k in want if k in got):
                dtype, shape = want[key]
                spec = got[key]
                if not _shape_matches(shape, spec["shape"], sizes) or spec["dtype"] != dtype:
                    problems.append(f"{name} {group} {key} is {spec['dtype']} "
                                    f"{_shape_text(spec['shape'])}, expected {dtype} "
                                    f"{_shape_text(shape, sizes)}")
    return problems, sizes


def _reads_characters(signatures: dict) -> bool:
    """Whether a tagger export is a character tagger's (CHARACTER_TAGGER_SIGNATURES): no
    words signature, and serving_default has an output only that kind has."""
    only = (set(CHARACTER_TAGGER_SIGNATURES["serving_default"][1])
            - set(TAGGER_SIGNATURES["serving_default"][1]))
    outputs = signatures.get("serving_default", {}).get("outputs", {})
    return "words" not in signatures and bool(only & set(outputs))


def _check_tagger_signature(report: Report, signatures) -> dict:
    characters = _reads_characters(signatures)
    problems, sizes = _signature_problems(
        signatures, CHARACTER_TAGGER_SIGNATURES if characters else TAGGER_SIGNATURES)
    what = ("character tagger: text -> units, tags and entities with character offsets"
            if characters else "tagger: text, and words -> words, tags, tag_ids, "
            "probabilities, num_words")
    report.add("signatures", not problems,
               "; ".join(problems) or f"{what} ({sizes['C']} tags)")
    return sizes


def _check_span_qa_signature(report: Report, signatures) -> dict:
    problems, sizes = _signature_problems(signatures, SPAN_QA_SIGNATURES)
    report.add("signatures", not problems, "; ".join(problems) or (
        f"span QA: question, context -> start/end logits [batch, {sizes['S']}], the answer "
        "and its spans; ids -> start/end logits"))
    return sizes


def _export_kinds(signatures: dict) -> list[str]:
    """The export kinds whose marks `signatures` (the probe's listing) carry: a signature,
    or an input or output of serving_default, that only that kind's exporter writes. One
    for every export the tools write, damaged or not (a tagger missing its words signature
    still has tags); none for a SavedModel made otherwise, several for one that mixes them."""
    default = signatures.get("serving_default", {"inputs": {}, "outputs": {}})
    ins, outs = set(default["inputs"]), set(default["outputs"])
    tagger_outputs = (set(TAGGER_SIGNATURES["serving_default"][1])
                      | set(CHARACTER_TAGGER_SIGNATURES["serving_default"][1])) - {"probabilities"}
    qa_inputs = set(SPAN_QA_SIGNATURES["serving_default"][0])
    qa_outputs = set(SPAN_QA_SIGNATURES["serving_default"][1]) - set(ENCODER_INPUTS)
    marks = {
        "encoder": "encoder" in signatures,
        "preprocessor": "special_tokens" in signatures,
        # serving_default's outputs mark them too: one that lost serve_examples is checked.
        "classifier": ("serve_examples" in signatures and "score" not in outs
                       or bool(outs & {"label", "label_id"})),
        "regressor": "score" in outs,
        "tagger": "words" in signatures or bool(outs & tagger_outputs),
        "span_qa": "ids" in signatures or bool(ins & qa_inputs or outs & qa_outputs),
    }
    return [kind for kind, marked in marks.items() if marked]


def _check_signatures(report: Report, signatures: dict, export_dir: str) -> tuple[str | None, dict]:
    """The "signatures" line, by the kind of export the signatures show (`_export_kinds`).
    Returns (that kind or None, the sizes its table fixes: the tagger's C, span QA's S)."""
    if "serving_default" not in signatures:
        report.add("signatures", False, f"no serving_default signature (found {sorted(signatures)})")
        return None, {}
    kinds = _export_kinds(signatures)
    if len(kinds) > 1:
        report.add("signatures", False, f"signatures {sorted(signatures)} mix those of "
                   f"several export kinds ({', '.join(kinds)})")
        return None, {}
    kind = kinds[0] if kinds else None
    sizes = {}
    if kind == "encoder":
        _check_encoder_signature(report, signatures["serving_default"])
    elif kind == "preprocessor":
        _check_preprocessor_signature(report, signatures)
    elif kind == "regressor":
        _check_regressor_signature(report, signatures, export_dir)
    elif kind == "classifier":
        _check_classifier_signature(report, signatures, export_dir)
    elif kind == "tagger":
        sizes = _check_tagger_signature(report, signatures)
    elif kind == "span_qa":
        sizes = _check_span_qa_signature(report, signatures)
    else:
        report.add("signatures", True, f"signatures {sorted(signatures)}")
    return kind, sizes


def _check_parity_applies(export_dir) -> list[str]:
    """--init_checkpoint's parity check feeds token ids to an encoder export; a text-in export
    (preprocessor, classifier, tagger, span QA) is refused in one line before anything runs,
    not reported as failing to load when the probe feeds it ids."""
    from google.protobuf.message import DecodeError

    from export.saved_model_writer import signature_method_names

    try:
        names = sorted(signature_method_names(export_dir))
    except DecodeError:
        return []  # reported as a damaged export by the op check
    if "encoder" not in names:
        raise VerifyError(
            f"--init_checkpoint: the parity check compares an encoder export (export_encoder) "
            f"with the checkpoint's encoder; {export_dir} is a text-in export (signatures "
            f"{names}), which its warmup and session checks cover: verify it without "
            "--init_checkpoint")
    return names


def verify(export_dir, init_checkpoint=None, bert_config_file=None, rtol=RTOL) -> Report:
    """Runs every check on `export_dir` and returns the report.

    `export_dir`: a version directory, or a model's base directory (what the export tools'
    --export_dir names), whose highest version is checked: the one TF Serving serves.
    `rtol`: the session and parity checks' tolerance, relative to each output's scale
    (module docstring).
    """
    from export import op_check

    from google.protobuf.message import DecodeError

    if not files.isdir(export_dir):
        raise VerifyError(f"--export_dir {export_dir}: no such directory (expected a model's "
                          "base directory or one of its versions, e.g. models/spam or "
                          "models/spam/1)")
    export_dir = served_version(export_dir)
    if not files.exists(os.path.join(export_dir, "saved_model.pb")):
        raise VerifyError(f"--export_dir {export_dir}: no saved_model.pb in it or in a numbered "
                          "version directory inside it (expected a model's base directory or "
                          "one of its versions, e.g. models/spam or models/spam/1)")
    if files.is_remote(export_dir):
        # The load check runs in another process, which cannot see ram:// (and the checks
        # here read the export with os and open): a local copy of the version is verified,
        # reported under the path given. TF Serving reads the same files from gs://.
        with files.local_copy(export_dir, directory=True) as local:
            try:
                report = verify(local, init_checkpoint, bert_config_file, rtol)
            except VerifyError as e:
                raise VerifyError(str(e).replace(local, export_dir)) from None
        report.export_dir = export_dir
        report.lines = [(check, ok, detail.replace(local, export_dir))
                        for check, ok, detail in report.lines]
        return report
    report = Report(export_dir)
    encoder = pretrainer = None
    if init_checkpoint:  # Loaded first: a wrong checkpoint fails before the slow probe.
        from bert_keras import model_loading
        from bert_keras.pretrainer import BertPretrainer

        names = _check_parity_applies(export_dir)
        ckpt = model_loading.load_checkpoint(init_checkpoint, bert_config_file)
        encoder = ckpt.encoder
        # An export with the mlm signature is compared on its MLM logits too, where the
        # checkpoint has the heads.
        if "mlm" in names and isinstance(ckpt.model, BertPretrainer):
            pretrainer = ckpt.model

    try:
        op_types = op_check.check_ops(export_dir)
        text_ops = sorted(set(op_types) - op_check.core_ops())
        text = bool(text_ops)
        report.add("ops", True, f"{len(op_types)} op types, all servable"
                   + (f" (tensorflow-text 2.12 ops: {', '.join(text_ops)})" if text else ""))
    except op_check.OpCheckError as e:
        report.add("ops", False, str(e))
        text = True
    except DecodeError as e:
        raise VerifyError(f"{os.path.join(export_dir, 'saved_model.pb')}: not a readable "
                          f"SavedModel protocol buffer ({e}); the export is damaged") from None
    _check_variables_index(export_dir)

    inputs = None
    if init_checkpoint:
        from bert_keras import model_loading
        from export.export_encoder import example_inputs, special_ids

        vocab_file = os.path.join(export_dir, "assets", "vocab.txt")
        model_loading.check_vocab_fits(encoder, vocab_file, init_checkpoint)  # before the probe
        cls_id, sep_id, vocab_size = special_ids(vocab_file)
        inputs = example_inputs(3, 16, cls_id, sep_id, vocab_size)
        if pretrainer is not None:
            inputs["masked_lm_positions"] = np.array([[1, 2], [3, 5], [0, 4]], np.int32)
    try:
        probe, outputs = _run_probe(export_dir, text, inputs)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        report.add("load", False, str(e))
        return report
    # `import tensorflow` itself imports keras (TF 2.21); what must not be needed is our code.
    leaked = [m for m in probe["modules"] if m in ("bert_keras", "data_prep")]
    imported = ["tensorflow"] + [m for m in probe["modules"] if m != "keras"]
    report.add("load", not leaked,
               f"loaded in a fresh process importing only {imported}"
               + (f"; it imported project code {leaked}" if leaked else ""))

    signatures = probe["signatures"]
    kind, sizes = _check_signatures(report, signatures, export_dir)

    if not os.path.exists(os.path.join(export_dir, WARMUP_FILE)):
        report.add("warmup", False, f"no {WARMUP_FILE}")
    else:
        bad = [w for w in probe["warmup"] if not w["finite"]]
        ok = bool(probe["warmup"]) and not bad
        report.add("warmup", ok, f"{len(probe['warmup'])} requests replayed"
                   + (f", {len(bad)} with non-finite outputs" if bad else ""))
        if kind in BUCKETED_SIGNATURES:
            _check_bucket_lengths(report, export_dir, kind, signatures, sizes, probe)
        else:
            _check_lengths(report, export_dir, probe["warmup"])

    session = probe["session"]
    if session["error"]:
        report.add("session", False, f"TF1 session loader (TF Serving's path) failed: "
                   f"{session['error']}")
    else:
        worst = session.get("worst")
        ok = bool(session["requests"]) and (
            worst is None or within_tolerance(worst["diff"], worst["scale"], rtol))
        detail = (f"max |session - tf2| = {_describe(worst['diff'], worst['scale'], worst['output'], rtol)}"
                  if worst else "no float outputs")
        report.add("session", ok, f"TF1 session loader (TF Serving's path): "
                   f"{session['requests']} requests, {detail}")

    if encoder is not None:
        ids = {k: v for k, v in inputs.items() if k != "masked_lm_positions"}
        expected = dict(encoder(ids, training=False))
        # Every layer, as the signature stacks them: [B, L, S, H].
        expected["encoder_outputs"] = np.stack(
            [np.asarray(x) for x in expected["encoder_outputs"]], axis=1)
        keys = ["pooled_output", "sequence_output", "encoder_outputs"]
        if pretrainer is not None:
            expected["mlm_logits"] = pretrainer(inputs, training=False)["mlm_logits"]
            keys.append("mlm_logits")
        checks = []  # (diff, scale, output)
        for key in keys:
            want = np.asarray(expected[key])
            checks.append((float(np.abs(want - outputs[key]).max()), float(np.abs(want).max()),
                           key))
        ok = all(within_tolerance(diff, scale, rtol) for diff, scale, _ in checks)
        diff, scale, key = max(checks, key=lambda c: c[0] / c[1] if c[1] > 0 else
                               (0.0 if c[0] == 0 else float("inf")))
        report.add("parity", ok, f"max |export - keras| = {_describe(diff, scale, key, rtol)}")
    return report


# --- Command line. ---

_EXPORT_DIR = flags.DEFINE_string(
    "export_dir", None, "The SavedModel to verify: a version directory, or the model's base "
    "directory (as given to the export tools), whose highest version TF Serving serves.",
    allow_override=True)
_INIT_CHECKPOINT = flags.DEFINE_string(
    "init_checkpoint", None, "Compare outputs with the Keras model from this checkpoint.",
    allow_override=True)
_BERT_CONFIG_FILE = flags.DEFINE_string("bert_config_file", None,
                                        "bert_config.json for --init_checkpoint if needed.",
                                        allow_override=True)
_RTOL = flags.DEFINE_float(
    "rtol", RTOL, "Tolerance of the session and parity checks, relative to each output's "
    "scale: max |got - expected| <= rtol * max |expected|.", allow_override=True)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    from bert_keras import checkpoints, model_loading
    from data_prep import cli

    def body() -> int:
        logging.info(keras_backend.describe(_ENVIRONMENT_BACKEND))
        if _BERT_CONFIG_FILE.value and not _INIT_CHECKPOINT.value:
            raise VerifyError("--bert_config_file configures --init_checkpoint's model, and "
                              "no --init_checkpoint is given; drop it (it would be ignored) "
                              "or name the checkpoint to compare with")
        report = verify(_EXPORT_DIR.value, _INIT_CHECKPOINT.value, _BERT_CONFIG_FILE.value,
                        _RTOL.value)
        print(report)
        return 0 if report.ok else 1

    return cli.report_errors(body, (VerifyError, model_loading.CheckpointError,
                                    checkpoints.WeightLoadError))


if __name__ == "__main__":
    from data_prep import cli

    cli.mark_required(["export_dir"])
    cli.run(main)
