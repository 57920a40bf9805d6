"""Exports a BertEncoder as a SavedModel for TF Serving (signatures: export/encoder_export.py).

    python -m export.export_encoder --init_checkpoint=DIR_OR_FILE --vocab_file=vocab.txt \
        --export_dir=/models/bert_encoder [--version=1] [--seq_length=128] [--mlm]
"""

from absl import app, flags

from export import saved_model_writer
from export.encoder_export import export_encoder


_INIT_CHECKPOINT = flags.DEFINE_string(
    "init_checkpoint", None,
    "Encoder weights: a run_pretraining output directory, a Hugging Face save_pretrained "
    "directory, a Google checkpoint prefix, or a .keras / .weights.h5 file.")
_BERT_CONFIG_FILE = flags.DEFINE_string(
    "bert_config_file", None, "bert_config.json, when the checkpoint does not carry its own.")
_VOCAB_FILE = flags.DEFINE_string(
    "vocab_file", None, "vocab.txt; defaults to the one beside the checkpoint.")
_EXPORT_DIR = flags.DEFINE_string(
    "export_dir", None, "Base directory; the SavedModel goes to <export_dir>/<version>.")
_VERSION = flags.DEFINE_integer(
    "version", None, "Version subdirectory (positive); default: next free number.")
_MLM = flags.DEFINE_boolean(
    "mlm", False, "Also export an `mlm` signature (needs a pretraining checkpoint).")
_SEQ_LENGTH = flags.DEFINE_integer(
    "seq_length", 128, "Sequence length of the warmup requests (your serving length).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    from bert_keras import model_loading

    try:
        loaded = model_loading.load_for_export(
            _INIT_CHECKPOINT.value, _BERT_CONFIG_FILE.value, _VOCAB_FILE.value, with_mlm=_MLM.value
        )
        path = export_encoder(
            loaded.encoder,
            _EXPORT_DIR.value,
            loaded.vocab_file,
            version=_VERSION.value,
            pretrainer=loaded.pretrainer,
            warmup_seq_length=_SEQ_LENGTH.value,
        )
    except (saved_model_writer.ExportError, ValueError, FileNotFoundError) as e:
        raise app.UsageError(str(e)) from None
    print(path)


if __name__ == "__main__":
    flags.mark_flags_as_required(['export_dir'])
    flags.mark_flag_as_required("init_checkpoint")
    app.run(main)
