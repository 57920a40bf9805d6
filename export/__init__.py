"""SavedModel exports for TF Serving (docs/DESIGN.md section 6).

Imports nothing: export.serving_probe loads exports in a process that must not import
project code (the export/verify "load" check), and it imports export.saved_model_writer.
The tools filter TensorFlow's start-up notices themselves (data_prep.tf_logging).
"""
