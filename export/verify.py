"""Proves an export in a clean process; exit status 1 if any check fails
(the checks: export/verification.py).

    python -m export.verify --export_dir=/models/bert_encoder/1 \
        [--init_checkpoint=CKPT [--bert_config_file=...]] [--atol=1e-5]
"""

from absl import app, flags

from export.verification import verify

_EXPORT_DIR = flags.DEFINE_string("export_dir", None, "The version directory to verify.")
_INIT_CHECKPOINT = flags.DEFINE_string(
    "init_checkpoint", None, "Compare outputs with the Keras model from this checkpoint.")
_BERT_CONFIG_FILE = flags.DEFINE_string("bert_config_file", None,
                                        "bert_config.json for --init_checkpoint if needed.")
_ATOL = flags.DEFINE_float("atol", 1e-5, "Tolerance of the parity check.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    report = verify(_EXPORT_DIR.value, _INIT_CHECKPOINT.value, _BERT_CONFIG_FILE.value, _ATOL.value)
    print(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    flags.mark_flags_as_required(['export_dir'])
    app.run(main)
