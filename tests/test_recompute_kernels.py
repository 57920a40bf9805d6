"""The JAX GPU kernels "layer_norm_recompute" and "gelu_recompute", checked on a CPU.

With the platform taken for a GPU (as tests/test_flash_attention.py does), LayerNorm and
GELU must compute Keras' functions, with gradients equal to JAX's autodiff of Keras' own
formulas (the reference), while keeping less for the backward pass: LayerNorm its input in
its own dtype and two numbers per row, GELU its input alone. What is kept is read with
`jax.ad_checkpoint.print_saved_residuals`, and the same reading of Keras' own layers shows
what the kernels avoid (so the checks can fail). On a CPU the kernels stay off.
"""

import re

import numpy as np
import pytest
from conftest import run_on_backend


def _residuals(capsys, fn, *args):
    """The residuals JAX keeps for fn's backward pass, as 'dtype[shape]' strings."""
    from jax.ad_checkpoint import print_saved_residuals

    capsys.readouterr()
    print_saved_residuals(fn, *args)
    lines = capsys.readouterr().out.splitlines()
    return [m.group(0) for line in lines for m in [re.match(r"\w+\[[\d,]*\]", line)] if m]


@pytest.mark.parametrize("backend", ["jax"])
def test_layer_norm_and_gelu_on_a_gpu_platform_keep_only_their_inputs(backend, monkeypatch,
                                                                       capsys):
    if run_on_backend(backend, __file__, f"test_layer_norm_and_gelu_on_a_gpu_platform_keep_"
                                         f"only_their_inputs[{backend}]"):
        return
    import jax
    import jax.numpy as jnp
    import keras

    from bert_keras import kernels
    from bert_keras.layers import LayerNorm
    from bert_keras.layers.activations import gelu

    assert not kernels.applies("layer_norm_recompute") and not kernels.applies("gelu_recompute")
    monkeypatch.setattr(kernels, "platform", lambda: "gpu")
    assert kernels.applies("layer_norm_recompute") and kernels.applies("gelu_recompute")

    rng = np.random.default_rng(0)
    shape = (4, 7, 16)
    # Rows with an offset and spread of their own, as a residual stream has.
    x = (rng.normal(size=shape) * rng.uniform(0.1, 5.0, shape[:-1] + (1,))
         + rng.normal(size=shape[:-1] + (1,)) * 3).astype("float32")
    upstream = rng.normal(size=shape).astype("float32")
    gamma = rng.normal(1.0, 0.3, shape[-1]).astype("float32")
    beta = rng.normal(0.0, 0.3, shape[-1]).astype("float32")

    def layer_loss(layer, weights=upstream):
        def loss(x, gamma, beta):
            y, _ = layer.stateless_call([gamma, beta], [], x)
            return jnp.sum(y.astype(jnp.float32) * weights)
        return loss

    for dtype, tolerance in (("float32", 1e-5), ("mixed_bfloat16", 2e-2)):
        ours = LayerNorm(epsilon=1e-12, dtype=dtype)
        ref = keras.layers.LayerNormalization(epsilon=1e-12, dtype=dtype)
        for layer in (ours, ref):
            layer.build(shape)
        xin = jnp.asarray(x, ours.compute_dtype)
        y, _ = ours.stateless_call([gamma, beta], [], xin)
        y_ref, _ = ref.stateless_call([gamma, beta], [], xin)
        assert y.dtype == y_ref.dtype == ours.compute_dtype
        np.testing.assert_allclose(np.asarray(y, "float32"), np.asarray(y_ref, "float32"),
                                   rtol=tolerance, atol=tolerance)
        grads = jax.grad(layer_loss(ours), argnums=(0, 1, 2))(xin, gamma, beta)
        grads_ref = jax.grad(layer_loss(ref), argnums=(0, 1, 2))(xin, gamma, beta)
        for g, g_ref, name in zip(grads, grads_ref, ("x", "gamma", "beta")):
            assert g.dtype == g_ref.dtype, name
            scale = float(np.max(np.abs(np.asarray(g_ref, "float32"))))
            np.testing.assert_allclose(np.asarray(g, "float32"), np.asarray(g_ref, "float32"),
                                       rtol=tolerance, atol=tolerance * scale, err_msg=name)
        if dtype == "mixed_bfloat16":
            # Kept: the bfloat16 input and [4, 7, 1] statistics; Keras' autodiff keeps
            # float32 tensors of the input's full shape. (A plain sum as the loss: its own
            # backward keeps nothing.)
            kept = _residuals(capsys, layer_loss(ours, 1.0), xin, gamma, beta)
            assert "bf16[4,7,16]" in kept and "f32[4,7,16]" not in kept, kept
            kept_ref = _residuals(capsys, layer_loss(ref, 1.0), xin, gamma, beta)
            assert "f32[4,7,16]" in kept_ref, kept_ref

    # GELU: Keras' values exactly, autodiff's derivative, only x kept.
    z = jnp.asarray(rng.normal(size=(3, 5, 32)) * 3, jnp.float32)

    def gelu_loss(fn, weights=upstream[:3, :5, :].repeat(2, -1)):
        return lambda z: jnp.sum(fn(z).astype(jnp.float32) * weights)

    def keras_gelu(z):
        return keras.ops.gelu(z, approximate=False)

    np.testing.assert_array_equal(np.asarray(gelu(z)), np.asarray(keras_gelu(z)))
    np.testing.assert_allclose(np.asarray(jax.grad(gelu_loss(gelu))(z)),
                               np.asarray(jax.grad(gelu_loss(keras_gelu))(z)),
                               rtol=1e-5, atol=1e-6)
    zb = z.astype(jnp.bfloat16)
    grad_b = jax.grad(gelu_loss(gelu))(zb)
    assert grad_b.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(grad_b, "float32"),
                               np.asarray(jax.grad(gelu_loss(keras_gelu))(zb), "float32"),
                               rtol=2e-2, atol=2e-2)
    kept = [r for r in _residuals(capsys, gelu_loss(gelu, 1.0), zb) if "[3,5,32]" in r]
    assert kept == ["bf16[3,5,32]"], kept
    kept_ref = [r for r in _residuals(capsys, gelu_loss(keras_gelu, 1.0), zb) if "[3,5,32]" in r]
    assert len(kept_ref) > 1, kept_ref


@pytest.mark.parametrize("backend", ["jax"])
def test_encoder_training_gradients_are_the_same_with_the_recompute_kernels(backend,
                                                                             monkeypatch):
    """A BertEncoder's gradients with the two kernels (platform taken for a GPU, the
    attention kernels off) equal those without them (the CPU computation), in float32."""
    if run_on_backend(backend, __file__, f"test_encoder_training_gradients_are_the_same_"
                                         f"with_the_recompute_kernels[{backend}]"):
        return
    import jax
    import jax.numpy as jnp

    from bert_keras import BertEncoder, kernels

    encoder = BertEncoder(vocab_size=50, num_layers=2, hidden_size=32, num_heads=2,
                          intermediate_size=64, dropout=0.0, attention_dropout=0.0,
                          max_sequence_length=16)
    rng = np.random.default_rng(1)
    inputs = {"input_word_ids": jnp.asarray(rng.integers(1, 50, (3, 12)), jnp.int32),
              "input_mask": jnp.asarray(np.arange(12)[None] < np.array([[12], [7], [3]]),
                                        jnp.int32),
              "input_type_ids": jnp.zeros((3, 12), jnp.int32)}
    trainable = [v.value for v in encoder.trainable_variables]

    def gradients():
        def loss(trainable):
            out, _ = encoder.stateless_call(trainable, [], inputs)
            return (jnp.sum(out["sequence_output"] ** 2)
                    + jnp.sum(out["pooled_output"]))
        return jax.jit(jax.value_and_grad(loss))(trainable)

    plain_loss, plain = gradients()
    monkeypatch.setattr(kernels, "platform", lambda: "gpu")
    monkeypatch.setenv(kernels.DISABLE_ENV, "flash_attention,cudnn_attention")
    assert kernels.applies("layer_norm_recompute") and kernels.applies("gelu_recompute")
    with_kernels_loss, with_kernels = gradients()
    np.testing.assert_allclose(float(with_kernels_loss), float(plain_loss), rtol=1e-6)
    # Some gradients are zero in exact arithmetic (the key bias': softmax ignores a shift);
    # float32 noise on them is judged against the largest gradient.
    scale = max(float(np.max(np.abs(np.asarray(w)))) for w in plain)
    for got, want in zip(with_kernels, plain):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4,
                                   atol=1e-6 * scale)
