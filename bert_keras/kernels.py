"""The one switch for hand-written, backend-specific kernels (docs/DESIGN.md section 7).

Layers, losses and optimizers are written in `keras.ops` and run on every Keras backend.
A few places have a faster kernel for one backend; each asks `applies(name)` whether its
kernel runs in the computation being traced, and otherwise takes the backend-neutral
path (or Keras' own code). A kernel runs when the backend is one it is written for and,
under XLA (every JAX computation; TensorFlow inside `jit_compile` or a TPU step), only
if it was measured to win there too (bench/ab_library_parts.py --jit_compile
--kernels_under_xla; BUILD_NOTES.md 8.9, "Kernels under XLA, measured"):

    | name               | what                                     | backends | XLA |
    | adam_fused         | AdamW's step as ResourceApplyAdam        | tf       | no  |
    | cross_entropy      | masked-LM loss, closed-form gradient     | tf       | yes |
    | dropout_16_bits    | 16 random bits per dropout decision      | tf       | yes |
    | dropout_hash       | dropout decisions from a counter hash    | jax      | yes |
    | padding_free       | real-token rows only (dynamic shapes)    | tf       | no  |
    | argmax             | MLM accuracy's argmax without -0.0 guard | tf       | yes |
    | layer_norm_gradient| LayerNorm's gradient in closed form      | all      | no  |
    | gelu_gradient      | GELU's derivative written out            | all      | no  |
    | gelu_16_bits       | 16-bit GELU in float32 from one exp      | jax, GPU | off*|
    | position_one_hot   | position rows as a one-hot matmul        | jax, GPU | off*|
    | residual_layer_norm| LayerNorm(x + residual), one Pallas pass | jax, GPU | off*|
    | dense_bias_16_bits | Dense bias added in bf16, f32 gradient   | jax, GPU | off*|
    | flash_attention    | attention with in-kernel dropout (Pallas)| jax, GPU | yes |
    | cudnn_attention    | cuDNN's flash attention, nothing dropped | jax, GPU | yes |
    | cudnn_key_lengths  | right-padded masks as key lengths        | jax, GPU | yes |

    * not measured yet: off unless $BERT_KERAS_ENABLE_KERNELS names it (UNMEASURED).

Backend-specific code that makes a result *right* rather than faster is not a kernel and
has no switch: a kernel turned off leaves the same arithmetic, and turning that code off
would bring a bug back. `losses._scale_for_replicas` and the word lookup's gradient
(`layers.embeddings.word_lookup`: each id once, where TensorFlow's gather gives Keras'
optimizers one row per occurrence) check `keras.backend.backend()` themselves.

Under XLA on a CPU (mini preset, paired medians of per-round ratios) the cross-entropy
kernel ran 1.35x and the 16-bit dropout 1.15x the library's step; the closed-form
LayerNorm and GELU gradients 0.86x and 0.93x (XLA fuses the autodiff of the plain
formulas better) and ResourceApplyAdam 1.02x (kept off: Keras' step is what TPUs run).
On JAX every computation is XLA's. The LayerNorm and GELU gradients are `keras.ops` code
and the only ones other backends (torch) get. The attention kernels run on JAX's GPU
platform only (bert_keras.flash_attention; bert_keras.layers.attention says which runs
when): `flash_attention` wherever attention probabilities are dropped, `cudnn_attention`
where none is, `cudnn_key_lengths` handing cuDNN a right-padded mask as key lengths
rather than as a [B, 1, Q, S] mask. Turning off `cudnn_attention` leaves the Pallas kernel
at rate 0 too; turning off both leaves XLA's fused attention and the explicit softmax.

`gelu_16_bits` computes the exact GELU of bfloat16 and float16 tensors in float32 with
Abramowitz and Stegun's erfc (7.1.26: one exp and one reciprocal, absolute error under
1.5e-7), keeps only the input for the backward pass and recomputes Phi(x) + x phi(x) there
from one exp. XLA's erf, which `keras.ops.gelu` runs, took 0.29-0.33 ms a layer at
BERT-base on an H200 (BUILD_NOTES.md 8.10), twice what keras-hub's tanh approximation
takes; and that formula evaluated in bfloat16 loses the values below x = -3, where this
one stays within 8e-3 relative (bfloat16's rounding included).

`position_one_hot` adds the position rows in training as one_hot(position ids, S) x
table[:S] (the segment rows' method; under JAX's default matmul precision an Ampere or newer
GPU rounds float32 operands to TF32, as in every float32 Dense product), so their gradient
is a [S, B * S] x [B * S, H] product rather than a sum over the batch axis. In the H200
profiles every [B, S, H] tensor of the step was laid out batch-minor ([S, H, B]), with 7.8
ms a step of transposes around the matrix products; the sum over the batch is the step's
only reduction over that axis alone. `residual_layer_norm` computes each layer's
LayerNorm(x + sublayer output) as one Pallas kernel (bert_keras.residual_layer_norm): XLA
ran the sum as a kernel of its own and the LayerNorm at 25% occupancy, 2.1 ms of a 15.1 ms
inference batch at BERT-base on an H200; its backward pass is XLA's closed form.
`dense_bias_16_bits` adds a mixed-precision Dense's bias in the compute dtype, where XLA
puts it in cuBLAS' epilogue, and keeps its gradient a float32 sum (bert_keras.layers.dense).

What XLA makes of them, read from BERT-base's pretraining step compiled for an H200 on a
CPU (bench/compile_for_gpu.py; BUILD_NOTES.md 8.10): `position_one_hot` alone or
`residual_layer_norm` alone leaves no batch-minor tensor and no transposing kernel in the
step (3,390 batch-minor tensors without them); outside the matrix products the step moves
75.0 GB without the kernels, 62.7 with `position_one_hot`, 56.0 with it and `gelu_16_bits`,
50.2 with `dense_bias_16_bits` too, and 69.3 with `residual_layer_norm` alone. Those are
bytes, not times: the four kernels' speed on a GPU is unmeasured, so all four are in
UNMEASURED: off unless $BERT_KERAS_ENABLE_KERNELS names them (bench_accelerator's
`ours@enable=...` rows).
"""

from __future__ import annotations

import os

import keras

_ALL = ("tensorflow", "jax", "torch", "numpy")
# name -> (backends it is written for, whether it runs under XLA)
KERNELS = {
    "adam_fused": (("tensorflow",), False),
    "cross_entropy": (("tensorflow",), True),
    "dropout_16_bits": (("tensorflow",), True),
    "dropout_hash": (("jax",), True),
    "padding_free": (("tensorflow",), False),
    "argmax": (("tensorflow",), True),
    "layer_norm_gradient": (_ALL, False),
    "gelu_gradient": (_ALL, False),
    "gelu_16_bits": (("jax",), True),
    "position_one_hot": (("jax",), True),
    "residual_layer_norm": (("jax",), True),
    "dense_bias_16_bits": (("jax",), True),
    "flash_attention": (("jax",), True),
    "cudnn_attention": (("jax",), True),
    "cudnn_key_lengths": (("jax",), True),
}
# Kernels that run only on some devices: name -> JAX platforms (jax.default_backend()).
PLATFORMS = {
    "flash_attention": ("gpu",),
    "cudnn_attention": ("gpu",),
    "cudnn_key_lengths": ("gpu",),
    "gelu_16_bits": ("gpu",),
    "position_one_hot": ("gpu",),
    "residual_layer_norm": ("gpu",),
    "dense_bias_16_bits": ("gpu",),
}

# Kernels not yet measured where they would run: off unless named in ENABLE_ENV (the
# accelerator bench's A/B rows), until a measurement moves them out of this set or removes
# them (docs/DESIGN.md section 7: a kernel runs under XLA only if it was measured to win).
UNMEASURED = frozenset({"gelu_16_bits", "position_one_hot", "residual_layer_norm",
                        "dense_bias_16_bits"})

# Kernels to leave out, comma-separated (benchmarks' A/B switch, tests of the neutral path).
DISABLE_ENV = "BERT_KERAS_DISABLE_KERNELS"
# UNMEASURED kernels to run, comma-separated (benchmarks' A/B switch, their tests).
ENABLE_ENV = "BERT_KERAS_ENABLE_KERNELS"


def in_tensorflow_xla() -> bool:
    """Whether the TensorFlow computation being traced is compiled by XLA (a `jit_compile`
    function or a TPU step). False outside a trace and on other backends."""
    if keras.backend.backend() != "tensorflow":
        return False
    from tensorflow.python.framework import ops as tf_ops
    from tensorflow.python.ops import control_flow_util

    return control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph())


def under_xla() -> bool:
    """Whether the computation being traced is compiled by XLA (always on JAX)."""
    return keras.backend.backend() == "jax" or in_tensorflow_xla()


def _named_kernels(env: str, allowed) -> set:
    """The names in $env; a name not in `allowed` is an error."""
    names = {n.strip() for n in os.environ.get(env, "").split(",") if n.strip()}
    unknown = sorted(names - set(allowed))
    if unknown:
        raise ValueError(f"{env}: unknown kernel names {unknown}; expected some of "
                         f"{sorted(allowed)}")
    return names


def disabled_kernels() -> set:
    """The names in $BERT_KERAS_DISABLE_KERNELS; an unknown name is an error."""
    return _named_kernels(DISABLE_ENV, KERNELS)


def enabled_kernels() -> set:
    """The names in $BERT_KERAS_ENABLE_KERNELS; a name not in UNMEASURED is an error."""
    return _named_kernels(ENABLE_ENV, UNMEASURED)


def applies(name: str) -> bool:
    """Whether kernel `name` (of KERNELS) runs in the computation being traced.

    Read while tracing: a model traced with $BERT_KERAS_DISABLE_KERNELS naming the kernel
    runs without it (bench/bench_pretraining.py's A/B rows; tests of the neutral path). An
    UNMEASURED kernel runs only where $BERT_KERAS_ENABLE_KERNELS names it.
    """
    if name in disabled_kernels():
        return False
    if name in UNMEASURED and name not in enabled_kernels():
        return False
    backends, with_xla = KERNELS[name]
    if keras.backend.backend() not in backends:
        return False
    if name in PLATFORMS and platform() not in PLATFORMS[name]:
        return False
    return with_xla or not under_xla()


def batch_mesh():
    """(mesh, batch axis name) of Keras' distribution where it splits the batch (JAX's
    DataParallel: a jax.sharding.Mesh), else (None, None). The GPU kernels' custom calls
    run on each device's rows over it (`jax.shard_map`): XLA cannot split a custom call,
    and would gather the batch to every device and compute all of it there."""
    distribution = keras.distribution.distribution() if platform() == "gpu" else None
    if not hasattr(distribution, "batch_dim_name"):
        return None, None
    return distribution.device_mesh.backend_mesh, distribution.batch_dim_name


def platform() -> str:
    """The device platform computations run on: JAX's default backend ("cpu", "gpu", "tpu")
    on JAX; "tensorflow" on TensorFlow (whose kernels above do not depend on the device)."""
    if keras.backend.backend() != "jax":
        return keras.backend.backend()
    import jax

    return jax.default_backend()
