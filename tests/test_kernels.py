"""bert_keras.kernels: where each hand-written kernel runs, and the A/B switch."""

import keras
import pytest
import tensorflow as tf

from bert_keras import kernels


def test_tensorflow_kernels_run_outside_xla_and_only_the_measured_ones_inside(monkeypatch):
    monkeypatch.delenv(kernels.DISABLE_ENV, raising=False)
    assert keras.backend.backend() == "tensorflow"
    outside = {name: kernels.applies(name) for name in kernels.KERNELS}
    written_for_tensorflow = {name for name, (backends, _) in kernels.KERNELS.items()
                              if "tensorflow" in backends or backends == kernels._ALL}
    assert {name for name, on in outside.items() if on} == written_for_tensorflow
    # The JAX kernels (attention, dropout, 16-bit GELU, position rows, residual LayerNorm)
    # are the only others.
    assert set(kernels.KERNELS) - written_for_tensorflow == {
        "flash_attention", "cudnn_attention", "cudnn_key_lengths", "dropout_hash",
        "gelu_16_bits", "position_one_hot", "residual_layer_norm", "dense_bias_16_bits"}

    @tf.function(jit_compile=True)
    def traced(x):
        inside.update({name: kernels.applies(name) for name in kernels.KERNELS})
        return x

    inside = {}
    traced(tf.constant(1.0))
    # BUILD_NOTES 8.9: under XLA the loss kernel, 16-bit dropout and TF's argmax won.
    assert {name for name, on in inside.items() if on} == {
        "cross_entropy", "dropout_16_bits", "argmax"}


def test_the_environment_turns_kernels_off_and_refuses_unknown_names(monkeypatch):
    monkeypatch.setenv(kernels.DISABLE_ENV, "gelu_gradient, adam_fused")
    assert not kernels.applies("gelu_gradient") and not kernels.applies("adam_fused")
    assert kernels.applies("layer_norm_gradient")
    monkeypatch.setenv(kernels.DISABLE_ENV, "gelu_gradient,fast_softmax")
    with pytest.raises(ValueError, match=r"unknown kernel names \['fast_softmax'\]"):
        kernels.applies("gelu_gradient")


def test_unmeasured_kernels_run_only_where_the_environment_enables_them(monkeypatch):
    """docs/DESIGN.md section 7: a kernel runs under XLA only once measured to win; those
    not yet measured (UNMEASURED) are off until $BERT_KERAS_ENABLE_KERNELS names them."""
    monkeypatch.delenv(kernels.ENABLE_ENV, raising=False)
    monkeypatch.delenv(kernels.DISABLE_ENV, raising=False)
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    monkeypatch.setattr(kernels, "platform", lambda: "gpu")
    assert kernels.UNMEASURED == {"gelu_16_bits", "position_one_hot", "residual_layer_norm",
                                  "dense_bias_16_bits"}
    assert kernels.applies("flash_attention")  # a measured JAX GPU kernel: on
    assert not any(kernels.applies(name) for name in kernels.UNMEASURED)
    monkeypatch.setenv(kernels.ENABLE_ENV, "gelu_16_bits")
    assert kernels.applies("gelu_16_bits") and not kernels.applies("position_one_hot")
    monkeypatch.setenv(kernels.DISABLE_ENV, "gelu_16_bits")  # disabling wins
    assert not kernels.applies("gelu_16_bits")
    monkeypatch.setattr(kernels, "platform", lambda: "cpu")  # still a GPU kernel only
    monkeypatch.delenv(kernels.DISABLE_ENV)
    assert not kernels.applies("gelu_16_bits")
    # Only UNMEASURED kernels can be enabled: the others are on where they apply.
    monkeypatch.setenv(kernels.ENABLE_ENV, "gelu_16_bits,flash_attention")
    with pytest.raises(ValueError, match=r"BERT_KERAS_ENABLE_KERNELS: unknown kernel names "
                                         r"\['flash_attention'\]"):
        kernels.applies("gelu_16_bits")
