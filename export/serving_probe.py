"""Loads a SavedModel the way a server would: in a fresh process, TensorFlow only.

Run by `export.verify` as a child process:
    python -m export.serving_probe EXPORT_DIR REPORT_JSON [--text] [--inputs IN.npz OUT.npz]
        [--warmup_outputs WARMUP.npz]

It imports tensorflow (and tensorflow_text with --text, as TF Serving links it in),
loads the export, records every signature's input and output specs, replays the warmup
requests through their signatures (with --warmup_outputs, saving request i's numeric
outputs to WARMUP.npz as "i/name"), and optionally runs `serving_default` on the arrays of
IN.npz, saving the outputs to OUT.npz. It then loads the export a second time with the
TF1 session loader, which is the path TF Serving's C++ SavedModelBundle and
`saved_model_cli run` take: the requests run again by SignatureDef tensor names and
must give the same outputs. It must not import keras or this project's model
code; the report records which modules were loaded so the caller can check that.
"""

import argparse
import json
import sys

import numpy as np
import tensorflow as tf


# What the text-in exports write at padding positions (export.length_buckets.PADDING_LOGIT;
# not imported: this process loads no project model code). Not a value the model computes,
# so it is left out of an output's scale: with it, a span-QA export's logits had a scale of
# 10,000 and the session check a tolerance of 1.0.
PADDING_FILL = -10000.0


def difference(got, want) -> tuple[float, float]:
    """(max |got - want|, the scale of `want`: max |want| where not both are PADDING_FILL)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not got.size:
        return 0.0, 0.0
    computed = (want != PADDING_FILL) | (got != PADDING_FILL)
    scale = float(np.abs(want[computed]).max()) if computed.any() else 0.0
    return float(np.abs(got - want).max()), scale


def _spec(spec):
    return {"dtype": spec.dtype.name, "shape": spec.shape.as_list()}


def probe(export_dir, text=False, inputs_file=None, outputs_file=None,
          warmup_outputs_file=None):
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
    requests = (read_warmup_requests(warmup_path) if tf.io.gfile.exists(warmup_path) else [])
    eager_outputs = [
        {k: v.numpy() for k, v in loaded.signatures[name](
            **{k: tf.constant(v) for k, v in request.items()}).items()}
        for name, request in requests
    ]
    if warmup_outputs_file:  # strings left out: np.load would need pickles for them
        np.savez(warmup_outputs_file, **{f"{i}/{k}": v for i, outputs in enumerate(eager_outputs)
                                         for k, v in outputs.items() if v.dtype != object})
    if inputs_file:
        arrays = dict(np.load(inputs_file, allow_pickle=False))
        # With masked_lm_positions, the encoder export's mlm signature runs on them too.
        mlm_arrays = arrays if "masked_lm_positions" in arrays else None
        arrays = {k: v for k, v in arrays.items() if k != "masked_lm_positions"}
        outputs = loaded.signatures["serving_default"](
            **{k: tf.constant(v) for k, v in arrays.items()}
        )
        outputs = {k: v.numpy() for k, v in outputs.items()}
        requests.append(("serving_default", arrays))
        eager_outputs.append(outputs)
        if mlm_arrays is not None:
            mlm = loaded.signatures["mlm"](**{k: tf.constant(v) for k, v in mlm_arrays.items()})
            mlm = {k: v.numpy() for k, v in mlm.items()}
            requests.append(("mlm", mlm_arrays))
            eager_outputs.append(mlm)
            outputs = {**outputs, **mlm}
        np.savez(outputs_file, **outputs)
    report["session"] = session_replay(export_dir, requests, eager_outputs)
    report["modules"] = sorted(
        m for m in ("keras", "bert_keras", "data_prep", "tensorflow_text") if m in sys.modules
    )
    return report


def _rank(diff: float, scale: float) -> tuple[float, float]:
    """Orders outputs by their difference relative to their scale; on a tie (every
    difference 0, as usual) the largest scale, so the report names a non-empty output."""
    relative = diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))
    return relative, scale


def session_replay(export_dir, requests, expected):
    """Runs `requests` through a TF1 Session loaded by `tf.compat.v1.saved_model.load`.

    Returns {"requests": n, "max_abs_diff": largest float difference from `expected`
    (the TF2 outputs), "worst": the float output whose difference is largest relative to
    its scale, as {"output", "diff", "scale"} (scale = max |TF2 output|), or None,
    "error": None or the first failure}.
    """
    result = {"requests": 0, "max_abs_diff": 0.0, "worst": None, "error": None}
    graph = tf.Graph()
    try:
        with tf.compat.v1.Session(graph=graph) as sess:
            meta_graph = tf.compat.v1.saved_model.load(sess, ["serve"], export_dir)
            for (name, request), want in zip(requests, expected):
                signature = meta_graph.signature_def[name]
                feed = {signature.inputs[k].name: v for k, v in request.items()}
                fetch = {k: t.name for k, t in signature.outputs.items()}
                got = sess.run(fetch, feed)
                for key, value in got.items():
                    if np.issubdtype(np.asarray(value).dtype, np.floating):
                        diff, scale = difference(value, want[key])
                        result["max_abs_diff"] = max(result["max_abs_diff"], diff)
                        worst = result["worst"]
                        if worst is None or _rank(diff, scale) > _rank(worst["diff"],
                                                                       worst["scale"]):
                            result["worst"] = {"output": f"{name}/{key}", "diff": diff,
                                               "scale": scale}
                    elif not np.array_equal(value, want[key]):
                        raise ValueError(f"signature {name!r} output {key!r} differs from TF2's")
                result["requests"] += 1
    except Exception as e:  # reported, not raised: the caller prints the failing check
        lines = [l for l in str(e).splitlines() if l.strip() and l != "Graph execution error:"]
        result["error"] = f"{type(e).__name__}: {(lines or [''])[0][:400]}"
    return result


def main(argv):
    """Parses `argv` (the program name first) and writes the probe's report."""
    # argparse, not absl: this process imports nothing of the project (see the docstring).
    parser = argparse.ArgumentParser(
        prog="python -m export.serving_probe",
        description="Loads an export as a server would and writes what it found as JSON "
                    "(export.verify runs it as a child process).")
    parser.add_argument("export_dir", help="the SavedModel (a version directory)")
    parser.add_argument("report_file", help="where the JSON report goes")
    parser.add_argument("--text", action="store_true",
                        help="import tensorflow_text first (text-in exports)")
    parser.add_argument("--inputs", nargs=2, metavar=("IN_NPZ", "OUT_NPZ"),
                        help="run serving_default on IN_NPZ's arrays, outputs to OUT_NPZ")
    parser.add_argument("--warmup_outputs", metavar="WARMUP_NPZ",
                        help="save the warmup requests' numeric outputs there")
    args = parser.parse_args(argv[1:])
    inputs_file, outputs_file = args.inputs or (None, None)
    report = probe(args.export_dir, text=args.text, inputs_file=inputs_file,
                   outputs_file=outputs_file, warmup_outputs_file=args.warmup_outputs)
    with open(args.report_file, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv)
