"""--mixed_precision: the Keras dtype policies a training tool runs in, declared once for
run_pretraining and the fine-tuning tools (run_classifier, run_tagger, run_squad), so the
flag has one list of values and one check everywhere.

  float32         the default: everything in float32
  mixed_bfloat16  bfloat16 compute, float32 variables (GPUs and TPUs with bfloat16)
  mixed_float16   float16 compute with loss scaling, float32 variables

LayerNorm, the attention softmax and the pretraining and task logits stay float32 under
every policy (docs/DESIGN.md), so the losses are float32 sums.
"""

from __future__ import annotations

from data_prep.cli import InputError, option

MIXED_PRECISION_POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
DEFAULT_POLICY = "float32"


def mixed_precision_option(help: str):
    """The `mixed_precision` field of a tool's options: an enum flag (absl refuses any other
    value when it parses the command line, in one line: `cli.parse_flags`)."""
    return option(DEFAULT_POLICY, help, enum=MIXED_PRECISION_POLICIES)


def check_mixed_precision(value) -> None:
    """The same check for options given in Python (no flag parsing): raises an InputError
    naming the flag and the accepted values, which every tool's boundary prints as one
    line."""
    if value not in MIXED_PRECISION_POLICIES:
        raise InputError("--mixed_precision", f"expected one of "
                         f"{', '.join(MIXED_PRECISION_POLICIES)}; found {value!r}")
