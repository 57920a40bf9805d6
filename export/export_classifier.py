"""Exports a fine-tuned classifier as an end-to-end SavedModel: text in, labels out.

    python -m export.export_classifier --model_dir=runs/spam \
        --export_dir=/models/spam [--version=1] [--max_seq_length=128] [--pair]

--model_dir is what `python -m bert_keras.run_classifier --do_train` wrote: model.keras,
labels.txt, vocab.txt and bert_config.json. See export/classifier_export.py for the
signatures (serving_default, pair, serve_examples for TF Serving's Classify API).
"""

import os

from absl import app, flags

from data_prep.tokenization import BertTokenizer
from export import saved_model_writer
from export.classifier_export import export_classifier

_MODEL_DIR = flags.DEFINE_string(
    "model_dir", None, "run_classifier's --output_dir (model.keras, labels.txt, vocab.txt).")
_EXPORT_DIR = flags.DEFINE_string(
    "export_dir", None, "Base directory; the SavedModel goes to <export_dir>/<version>.")
_VERSION = flags.DEFINE_integer("version", None, "Version (positive); default: next free.")
_MAX_SEQ_LENGTH = flags.DEFINE_integer(
    "max_seq_length", 128, "Sequence length the classifier was fine-tuned with.")
_DO_LOWER_CASE = flags.DEFINE_boolean("do_lower_case", True, "Lowercase input (uncased models).")
_STRIP_ACCENTS = flags.DEFINE_enum(
    "strip_accents", "auto", ["auto", "true", "false"],
    "Strip accents (NFD + drop Mn); auto follows --do_lower_case. Korean: false.")
_PAIR = flags.DEFINE_boolean(
    "pair", False, "The task classifies sentence pairs (serve_examples reads text and text_b).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    import keras

    from bert_keras.finetune import LABELS_FILE, TASK_MODEL_FILE, read_labels
    from bert_keras.tasks import BertClassifier

    model_path = os.path.join(_MODEL_DIR.value, TASK_MODEL_FILE)
    try:
        for name in (TASK_MODEL_FILE, LABELS_FILE, "vocab.txt"):
            if not os.path.exists(os.path.join(_MODEL_DIR.value, name)):
                raise FileNotFoundError(f"{_MODEL_DIR.value}: no {name} (expected run_classifier's "
                                        "output directory)")
        classifier = keras.saving.load_model(model_path)
        if not isinstance(classifier, BertClassifier):
            raise ValueError(f"{model_path} holds a {type(classifier).__name__}, not a BertClassifier")
        strip = {"auto": None, "true": True, "false": False}[_STRIP_ACCENTS.value]
        tokenizer = BertTokenizer(os.path.join(_MODEL_DIR.value, "vocab.txt"),
                                  do_lower_case=_DO_LOWER_CASE.value, strip_accents=strip)
        labels = read_labels(os.path.join(_MODEL_DIR.value, LABELS_FILE))
        path = export_classifier(classifier, tokenizer, labels, _EXPORT_DIR.value,
                                 _MAX_SEQ_LENGTH.value, pair=_PAIR.value, version=_VERSION.value)
    except (saved_model_writer.ExportError, ValueError, FileNotFoundError) as e:
        raise app.UsageError(str(e)) from None
    print(path)


if __name__ == "__main__":
    flags.mark_flags_as_required(['model_dir', 'export_dir'])
    app.run(main)
