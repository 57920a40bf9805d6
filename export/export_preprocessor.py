"""Exports the BERT text preprocessor (signatures: export/preprocessor_export.py).

    python -m export.export_preprocessor --vocab_file=vocab.txt --do_lower_case \
        --seq_length=128 --export_dir=/models/bert_preprocess [--version=1]
"""

from absl import app, flags

from data_prep.tokenization import BertTokenizer
from export import saved_model_writer
from export.preprocessor_export import export_preprocessor

_VOCAB_FILE = flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt.")
_DO_LOWER_CASE = flags.DEFINE_boolean("do_lower_case", True, "Lowercase input (uncased models).")
_STRIP_ACCENTS = flags.DEFINE_enum(
    "strip_accents", "auto", ["auto", "true", "false"],
    "Strip accents (NFD + drop Mn); auto follows --do_lower_case. Korean: false.")
_SEQ_LENGTH = flags.DEFINE_integer("seq_length", 128, "Output sequence length.")
_EXPORT_DIR = flags.DEFINE_string(
    "export_dir", None, "Base directory; the SavedModel goes to <export_dir>/<version>.")
_VERSION = flags.DEFINE_integer("version", None, "Version (positive); default: next free.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    strip = {"auto": None, "true": True, "false": False}[_STRIP_ACCENTS.value]
    try:
        tokenizer = BertTokenizer(_VOCAB_FILE.value, do_lower_case=_DO_LOWER_CASE.value,
                                  strip_accents=strip)
        path = export_preprocessor(tokenizer, _EXPORT_DIR.value, _SEQ_LENGTH.value,
                                   _VERSION.value)
    except (saved_model_writer.ExportError, ValueError, FileNotFoundError) as e:
        raise app.UsageError(str(e)) from None
    print(path)


if __name__ == "__main__":
    flags.mark_flags_as_required(['vocab_file', 'export_dir'])
    app.run(main)
