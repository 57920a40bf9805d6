"""Loads a SavedModel the way a server would: in a fresh process, TensorFlow only.

Run by `export.verify` as a child process:
    python -m export.serving_probe EXPORT_DIR REPORT_JSON [--text] [--inputs IN.npz OUT.npz]

It imports tensorflow (and tensorflow_text with --text, as TF Serving links it in),
loads the export, records every signature's input and output specs, replays the warmup
requests through their signatures, and optionally runs `serving_default` on the arrays of
IN.npz, saving the outputs to OUT.npz. It must not import keras or this project's model
code; the report records which modules were loaded so the caller can check that.
"""

import json
import sys

import numpy as np
import tensorflow as tf


def _spec(spec):
    return {"dtype": spec.dtype.name, "shape": spec.shape.as_list()}


def probe(export_dir, text=False, inputs_file=None, outputs_file=None):
    if text:
        import tensorflow_text  # noqa: F401  (registers the TFText ops the graph uses)
    from export.saved_model_writer import WARMUP_FILE, read_warmup_requests

    loaded = tf.saved_model.load(export_dir)
    report = {"signatures": {}, "warmup": []}
    for name, fn in loaded.signatures.items():
        _, kwargs = fn.structured_input_signature
        report["signatures"][name] = {
            "inputs": {k: _spec(v) for k, v in kwargs.items()},
            "outputs": {k: _spec(v) for k, v in fn.structured_outputs.items()},
        }
    warmup_path = f"{export_dir}/{WARMUP_FILE}"
    if tf.io.gfile.exists(warmup_path):
        for signature_name, request in read_warmup_requests(warmup_path):
            fn = loaded.signatures[signature_name]
            outputs = fn(**{k: tf.constant(v) for k, v in request.items()})
            report["warmup"].append(
                {
                    "signature": signature_name,
                    "inputs": {k: list(v.shape) for k, v in request.items()},
                    "outputs": {k: list(v.shape) for k, v in outputs.items()},
                    "finite": bool(
                        all(np.isfinite(v.numpy()).all() for v in outputs.values()
                            if v.dtype.is_floating)
                    ),
                }
            )
    if inputs_file:
        arrays = dict(np.load(inputs_file, allow_pickle=False))
        outputs = loaded.signatures["serving_default"](
            **{k: tf.constant(v) for k, v in arrays.items()}
        )
        np.savez(outputs_file, **{k: v.numpy() for k, v in outputs.items()})
    report["modules"] = sorted(
        m for m in ("keras", "bert_keras", "data_prep", "tensorflow_text") if m in sys.modules
    )
    return report


def main(argv):
    export_dir, report_file = argv[1], argv[2]
    text = "--text" in argv
    inputs_file = outputs_file = None
    if "--inputs" in argv:
        i = argv.index("--inputs")
        inputs_file, outputs_file = argv[i + 1], argv[i + 2]
    report = probe(export_dir, text=text, inputs_file=inputs_file, outputs_file=outputs_file)
    with open(report_file, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv)
