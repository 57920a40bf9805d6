r"""Proves an export: loads it in a clean process and checks what a server will rely on.

    python -m export.verify --export_dir=/models/bert_encoder/1 \
        [--init_checkpoint=CKPT [--bert_config_file=...]] [--atol=1e-5]

Checks, each reported on one line; exit status 1 if any fails:
  ops        every op is core TensorFlow or in stock TF Serving's tensorflow-text 2.12.1
  load       a fresh Python process importing only tensorflow (+ tensorflow_text when the
             graph holds text ops) loads the SavedModel; no project code is imported
  signatures names, dtypes and shapes of the known export kinds (encoder, ...)
  warmup     assets.extra/tf_serving_warmup_requests parses as PredictionLog records and
             every request runs, with finite outputs
  session    the TF1 session loader (TF Serving's C++ loader and `saved_model_cli run`
             take this path) restores the variables, and the same requests give the
             same outputs by SignatureDef tensor names (within atol)
  parity     with --init_checkpoint: the export's outputs equal the Keras model's (atol)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

import numpy as np
from absl import app, flags

from data_prep import schema
from export.saved_model_writer import WARMUP_FILE

# What a TF Hub BERT encoder signature must look like.
ENCODER_INPUTS = schema.MODEL_INPUT_NAMES
ENCODER_OUTPUTS = ("pooled_output", "sequence_output", "encoder_outputs", "default")


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


def _run_probe(export_dir, text, inputs=None, timeout=600):
    """Runs export.serving_probe in a fresh interpreter; returns (report, outputs|None)."""
    with tempfile.TemporaryDirectory() as tmp:
        report_file = os.path.join(tmp, "report.json")
        cmd = [sys.executable, "-m", "export.serving_probe", export_dir, report_file]
        if text:
            cmd.append("--text")
        outputs_file = os.path.join(tmp, "outputs.npz")
        if inputs is not None:
            inputs_file = os.path.join(tmp, "inputs.npz")
            np.savez(inputs_file, **inputs)
            cmd += ["--inputs", inputs_file, outputs_file]
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   TF_CPP_MIN_LOG_LEVEL="2")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
            raise RuntimeError(f"the export did not load in a fresh process:\n{tail}")
        with open(report_file) as f:
            report = json.load(f)
        outputs = dict(np.load(outputs_file)) if inputs is not None else None
    return report, outputs


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


def _check_classifier_signature(report: Report, signatures, export_dir) -> bool:
    from export.saved_model_writer import signature_method_names

    problems = []
    outs = signatures["serving_default"]["outputs"]
    for key, dtype, rank in (("probabilities", "float32", 2), ("label", "string", 1),
                             ("label_id", "int32", 1)):
        spec = outs.get(key)
        if spec is None or spec["dtype"] != dtype or len(spec["shape"]) != rank:
            problems.append(f"serving_default output {key} should be {dtype} rank {rank}, got {spec}")
    examples = signatures["serve_examples"]
    if list(examples["inputs"]) != ["inputs"] or set(examples["outputs"]) != {"classes", "scores"}:
        problems.append("serve_examples should map `inputs` to `classes` and `scores`")
    method = signature_method_names(export_dir).get("serve_examples")
    if method != "tensorflow/serving/classify":
        problems.append(f"serve_examples method is {method!r}, TF Serving's Classify API needs "
                        "'tensorflow/serving/classify'")
    return report.add("signatures", not problems, "; ".join(problems) or
                      "classifier: text -> probabilities/label; serve_examples for Classify")


def verify(export_dir, init_checkpoint=None, bert_config_file=None, atol=1e-5) -> Report:
    """Runs every check on `export_dir` (a version directory) and returns the report."""
    from export import op_check

    report = Report(export_dir)
    if not os.path.exists(os.path.join(export_dir, "saved_model.pb")):
        report.add("load", False, f"no saved_model.pb in {export_dir} (pass the version directory)")
        return report

    try:
        op_types = op_check.check_ops(export_dir)
        text_ops = sorted(set(op_types) - op_check.core_ops())
        text = bool(text_ops)
        report.add("ops", True, f"{len(op_types)} op types, all servable"
                   + (f" (tensorflow-text 2.12 ops: {', '.join(text_ops)})" if text else ""))
    except op_check.OpCheckError as e:
        report.add("ops", False, str(e))
        text = True

    inputs = None
    if init_checkpoint:
        from export.export_encoder import example_inputs, special_ids

        cls_id, sep_id, vocab_size = special_ids(os.path.join(export_dir, "assets", "vocab.txt"))
        inputs = example_inputs(3, 16, cls_id, sep_id, vocab_size)
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
    if "serving_default" not in signatures:
        report.add("signatures", False, f"no serving_default signature (found {sorted(signatures)})")
    elif "encoder" in signatures:
        _check_encoder_signature(report, signatures["serving_default"])
    elif "special_tokens" in signatures:
        _check_preprocessor_signature(report, signatures)
    elif "serve_examples" in signatures:
        _check_classifier_signature(report, signatures, export_dir)
    else:
        report.add("signatures", True, f"signatures {sorted(signatures)}")

    if not os.path.exists(os.path.join(export_dir, WARMUP_FILE)):
        report.add("warmup", False, f"no {WARMUP_FILE}")
    else:
        bad = [w for w in probe["warmup"] if not w["finite"]]
        ok = bool(probe["warmup"]) and not bad
        report.add("warmup", ok, f"{len(probe['warmup'])} requests replayed"
                   + (f", {len(bad)} with non-finite outputs" if bad else ""))

    session = probe["session"]
    if session["error"]:
        report.add("session", False, f"TF1 session loader (TF Serving's path) failed: "
                   f"{session['error']}")
    else:
        report.add("session", bool(session["requests"]) and session["max_abs_diff"] <= atol,
                   f"TF1 session loader (TF Serving's path): {session['requests']} requests, "
                   f"max |session - tf2| = {session['max_abs_diff']:.1e}")

    if init_checkpoint:
        from bert_keras import model_loading

        encoder = model_loading.load_encoder(init_checkpoint, bert_config_file)
        expected = encoder(inputs, training=False)
        diffs = {
            "pooled_output": np.abs(np.asarray(expected["pooled_output"]) - outputs["pooled_output"]).max(),
            "sequence_output": np.abs(np.asarray(expected["sequence_output"]) - outputs["sequence_output"]).max(),
        }
        worst = max(diffs.values())
        report.add("parity", worst <= atol,
                   f"max |export - keras| = {worst:.2e} (atol {atol:g}) over {sorted(diffs)}")
    return report


# --- Command line. ---

_EXPORT_DIR = flags.DEFINE_string("export_dir", None, "The version directory to verify.",
                                  allow_override=True)
_INIT_CHECKPOINT = flags.DEFINE_string(
    "init_checkpoint", None, "Compare outputs with the Keras model from this checkpoint.",
    allow_override=True)
_BERT_CONFIG_FILE = flags.DEFINE_string("bert_config_file", None,
                                        "bert_config.json for --init_checkpoint if needed.",
                                        allow_override=True)
_ATOL = flags.DEFINE_float("atol", 1e-5, "Tolerance of the parity check.", allow_override=True)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    report = verify(_EXPORT_DIR.value, _INIT_CHECKPOINT.value, _BERT_CONFIG_FILE.value, _ATOL.value)
    print(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    flags.mark_flags_as_required(["export_dir"])
    app.run(main)
