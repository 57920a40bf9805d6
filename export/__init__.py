"""SavedModel exports for TF Serving (docs/DESIGN.md section 6)."""

from data_prep import tf_logging

tf_logging.import_tensorflow()  # without TensorFlow's C++ start-up notices
