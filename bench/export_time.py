r"""Export time, SavedModel graph size and load time of every text-in export kind.

    .venv/bin/python bench/export_time.py [--preset=tiny] [--seq_length=128] [--loads=3]

What a user waits for at `export_*` and what TF Serving waits for when it loads a new model
version: each export kind of a randomly initialised model (the preprocessor; classifier,
tagger and span QA, text in) is written by its export function in this process (wall time,
after a first export of the same kind has warmed TensorFlow up), then loaded in fresh
processes (`tf.saved_model.load` with tensorflow-text imported, as TF Serving links it, and
one request on `serving_default`; the least of --loads runs). The peer row is Keras' own
exporter (`model.export`, ids in, the ExportArchive keras-hub's models export with) on the
same classifier. saved_model.pb's size and its function count are what loading parses and
instantiates.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

_LOAD = textwrap.dedent("""
    import json, sys, time
    start = time.perf_counter()
    import tensorflow as tf, tensorflow_text  # noqa: F401
    imported = time.perf_counter()
    model = tf.saved_model.load(sys.argv[1])
    loaded = time.perf_counter()
    fn = model.signatures["serving_default"]
    specs = fn.structured_input_signature[1]
    inputs = {name: (tf.constant(["w1 w2 w3"] * 1) if spec.dtype == tf.string else
                     tf.ones([1] + [8] * (spec.shape.rank - 1), spec.dtype))
              for name, spec in specs.items()}
    fn(**inputs)
    first = time.perf_counter() - loaded
    print(json.dumps({"load_s": loaded - imported, "first_request_s": first}))
""")


def graph_figures(path):
    """(saved_model.pb bytes, functions in its library)."""
    from tensorflow.core.protobuf import saved_model_pb2

    pb = os.path.join(path, "saved_model.pb")
    saved_model = saved_model_pb2.SavedModel()
    with open(pb, "rb") as f:
        saved_model.ParseFromString(f.read())
    return os.path.getsize(pb), len(saved_model.meta_graphs[0].graph_def.library.function)


def load_times(path, loads):
    """The least load and first-request seconds over `loads` fresh processes."""
    import json

    runs = []
    for _ in range(loads):
        out = subprocess.run([sys.executable, "-c", _LOAD, path], capture_output=True, text=True,
                             env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return min(r["load_s"] for r in runs), min(r["first_request_s"] for r in runs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny", help="BertConfig preset (tiny, ..., base)")
    parser.add_argument("--seq_length", type=int, default=128)
    parser.add_argument("--loads", type=int, default=3, help="fresh-process loads per export")
    args = parser.parse_args()

    from bert_keras import BertEncoder
    from bert_keras.tasks import BertClassifier, BertSpanQA, BertTagger
    from data_prep.tokenization import BertTokenizer
    from export.export_classifier import export_classifier
    from export.export_preprocessor import export_preprocessor
    from export.export_span_qa import export_span_qa
    from export.export_tagger import export_tagger

    with tempfile.TemporaryDirectory() as tmp:
        encoder = BertEncoder.from_preset(args.preset)
        vocab = os.path.join(tmp, "vocab.txt")
        with open(vocab, "w") as f:
            f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] +
                              [f"w{i}" for i in range(encoder.vocab_size - 5)]) + "\n")
        tokenizer = BertTokenizer(vocab)
        config = encoder.get_config()
        classifier = BertClassifier(BertEncoder.from_config(config), num_classes=2)
        kinds = {
            "preprocessor": lambda d: export_preprocessor(tokenizer, d, args.seq_length),
            "classifier": lambda d: export_classifier(classifier, tokenizer, ["a", "b"], d,
                                                      args.seq_length, pair=True),
            "tagger": lambda d: export_tagger(
                BertTagger(BertEncoder.from_config(config), num_classes=3), tokenizer,
                ["O", "B-X", "I-X"], d, args.seq_length),
            "span_qa": lambda d: export_span_qa(BertSpanQA(BertEncoder.from_config(config)),
                                                tokenizer, d, args.seq_length),
        }
        print(f"preset {args.preset}, seq_length {args.seq_length}, least of {args.loads} loads")
        print(f"{'export':<36} {'export s':>9} {'pb MB':>7} {'functions':>9} {'load s':>7} "
              f"{'1st request s':>13}")
        for kind, export in kinds.items():
            export(os.path.join(tmp, kind, "warm"))  # traces once: TensorFlow's first-use costs
            start = time.perf_counter()
            path = export(os.path.join(tmp, kind, "timed"))
            seconds = time.perf_counter() - start
            size, functions = graph_figures(path)
            load, first = load_times(path, args.loads)
            print(f"{'ours ' + kind + ' (text in)':<36} {seconds:9.1f} {size / 1e6:7.2f} "
                  f"{functions:9d} {load:7.2f} {first:13.2f}", flush=True)
        path = os.path.join(tmp, "keras_export")
        start = time.perf_counter()
        classifier.export(path, format="tf_saved_model", verbose=False)
        seconds = time.perf_counter() - start
        size, functions = graph_figures(path)
        load, first = load_times(path, args.loads)
        print(f"{'Keras model.export classifier (ids)':<36} {seconds:9.1f} {size / 1e6:7.2f} "
              f"{functions:9d} {load:7.2f} {first:13.2f}")


if __name__ == "__main__":
    main()
