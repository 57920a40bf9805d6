"""TensorFlow's `saved_model_cli`, quiet, with the text ops our exports use registered.

    python -m export.saved_model_cli show --all --dir out/quickstart/models/spam_classifier/1
    python -m export.saved_model_cli run --dir out/quickstart/models/spam_classifier/1 \
        --tag_set serve --signature_def serving_default \
        --input_exprs 'text=["Win a FREE cruise!"]'

Every argument is saved_model_cli's own (`--help` lists them). Two things differ from the
`saved_model_cli` program TensorFlow installs:
  - TensorFlow is imported through `data_prep.tf_logging`, so its C++ start-up notices
    (oneDNN, CUDA probing, absl's pre-initialisation banner: about ten lines), the oneDNN
    int64 notice and TensorFlow's deprecation warnings for the TF1 loader it uses are not
    printed; `TF_CPP_MIN_LOG_LEVEL=0` brings them back. The plain program prints the
    start-up lines before any environment variable can hide them.
  - `tensorflow_text` is imported first: `run` on a preprocessor or classifier export needs
    its FastBertNormalize / FastWordpieceTokenizeWithOffsets ops registered in the process.
"""

from __future__ import annotations

import logging
import sys


def main(argv: list[str] | None = None) -> None:
    """Runs saved_model_cli with `argv` (default: this process's arguments)."""
    from data_prep import tf_logging

    tf = tf_logging.import_tensorflow()
    import tensorflow_text  # noqa: F401  (registers the text ops the exports use)
    if tf_logging.log_level() > 0:
        # saved_model_cli loads with TF1's loader, whose deprecation warnings (printed twice,
        # through TensorFlow's handler and absl's) are not for the user of an export. A
        # filter, since saved_model_cli sets the logger's level to INFO itself.
        tf.get_logger().addFilter(lambda record: record.levelno >= logging.ERROR)
    from tensorflow.python.tools import saved_model_cli

    sys.argv = ["saved_model_cli", *(sys.argv[1:] if argv is None else argv)]
    saved_model_cli.main()


if __name__ == "__main__":
    main()
