"""Proves an export: loads it in a clean process and checks what a server will rely on.

    python -m export.verify --export_dir=/models/bert_encoder/1 \
        [--init_checkpoint=CKPT [--bert_config_file=...]] [--atol=1e-5]

Checks, each reported on one line; exit status 1 if any fails:
  ops        every op is core TensorFlow or in stock TF Serving's tensorflow-text 2.12.1
  load       a fresh Python process importing only tensorflow (+ tensorflow_text when the
             graph holds text ops) loads the SavedModel; no project code is imported
  signatures names, dtypes and shapes of the known export kinds (encoder, ...)
  warmup     assets.extra/tf_serving_warmup_requests parses as PredictionLog records and
             every request runs, with finite outputs
  parity     with --init_checkpoint: the export's outputs equal the Keras model's (atol)
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
