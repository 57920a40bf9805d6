"""The JAX GPU kernels of the layers outside attention, checked on a CPU.

"position_one_hot": the embeddings with the position rows as a one-hot product equal the
sliced table's, and the step exported for CUDA has no sum over the batch axis alone.

"gelu_16_bits", against float64 GELU.

"dense_bias_16_bits": a mixed-precision Dense adds its bias in bfloat16, with a float32
gradient.

"residual_layer_norm": LayerNorm(x + residual) as one Pallas kernel (run by Pallas'
interpreter here), against float64 and, for gradients, against Keras' LayerNorm of the sum;
the transformer block takes it for both of its LayerNorms.

All four are off until measured on a GPU (kernels.UNMEASURED): the tests name them in
$BERT_KERAS_ENABLE_KERNELS. With the platform taken for a GPU (as
tests/test_flash_attention.py does), GELU of a
bfloat16 tensor is computed in float32 from Abramowitz and Stegun's erfc. The reference is
scipy's float64 erfc: GELU(x) = x erfc(-x / sqrt 2) / 2 and its derivative
Phi(x) + x phi(x), on every bfloat16 value in [-12, 12]. Keras' own bfloat16 GELU is read
the same way, to show what the kernel's bounds rule out. Float32 inputs and CPUs keep
Keras' function.
"""

import re

import numpy as np
import pytest
import bert_keras  # noqa: F401  (sets up TensorFlow before Keras is imported)
import keras
from conftest import run_module_on_backend

# Every test here runs on JAX (the kernels are JAX's): in this process if it runs JAX,
# else all of them in one fresh JAX process (`test_this_module_holds_on_jax`).
JAX_ONLY = pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX's kernels")
# The test under a batch-sharded mesh needs two JAX devices: the JAX process gets two host
# devices (XLA_FLAGS); elsewhere it skips.
TWO_HOST_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}


def _two_devices():
    import jax

    return len(jax.devices()) >= 2


def _exact(x):
    from scipy import special

    x = np.asarray(x, np.float64)
    cdf = 0.5 * special.erfc(-x / np.sqrt(2.0))
    return x * cdf, cdf + x * np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi)


def _worst_errors(got, want, x):
    """(max relative error where x >= -6, max absolute error where x < -6)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    core = x >= -6
    relative = np.abs(got - want)[core] / np.maximum(np.abs(want[core]), 1e-30)
    return float(relative.max()), float(np.abs(got - want)[~core].max())


@JAX_ONLY
def test_16_bit_gelu_on_a_gpu_platform_is_within_bfloat16_rounding_of_float64(monkeypatch,
                                                                              capsys):
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    from jax.ad_checkpoint import print_saved_residuals

    from bert_keras import kernels
    from bert_keras.layers import activations

    x = np.unique(np.linspace(-12, 12, 400_001).astype(ml_dtypes.bfloat16))
    x64 = x.astype(np.float64)
    value, derivative = _exact(x64)
    xb = jnp.asarray(x)

    def keras_gelu(z):
        return keras.ops.gelu(z, approximate=False)

    # Kernel off (the platform taken for a CPU, whatever this machine has): Keras' function.
    monkeypatch.setattr(kernels, "platform", lambda: "cpu")
    assert not kernels.applies("gelu_16_bits")
    np.testing.assert_array_equal(np.asarray(activations.gelu(xb), np.float32),
                                  np.asarray(keras_gelu(xb), np.float32))

    monkeypatch.setattr(kernels, "platform", lambda: "gpu")
    monkeypatch.setenv(kernels.ENABLE_ENV, ",".join(kernels.UNMEASURED))
    assert kernels.applies("gelu_16_bits")
    used = []
    original = activations._gelu_16_bits
    monkeypatch.setattr(activations, "_gelu_16_bits",
                        lambda z: (used.append(z.dtype), original(z))[1])
    y = activations.gelu(xb)
    grad = jax.grad(lambda z: jnp.sum(activations.gelu(z).astype(jnp.float32)))(xb)
    assert used and y.dtype == grad.dtype == jnp.bfloat16
    # bfloat16 rounding alone is up to 2^-8 relative; the approximation adds up to 3.6e-3 near
    # x = -6 and 1e-6 for x > -3.
    relative, absolute = _worst_errors(y, value, x64)
    assert relative < 8e-3 and absolute < 1e-8, (relative, absolute)
    relative, absolute = _worst_errors(grad, derivative, x64)
    assert relative < 8e-3 and absolute < 1e-7, (relative, absolute)
    mid = (x64 > -3) & (np.abs(value) > 1e-3)
    assert np.max(np.abs(np.asarray(y, np.float64) - value)[mid] / np.abs(value[mid])) < 4e-3
    # Keras' bfloat16 GELU fails the same bound (erf(x / sqrt 2) + 1 rounded to bfloat16).
    assert _worst_errors(keras_gelu(xb), value, x64)[0] > 0.1

    # float16 too (where its values are normal numbers); float32 keeps Keras' function.
    normal = x64 >= -4
    yh = activations.gelu(jnp.asarray(x64[normal], jnp.float16))
    assert yh.dtype == jnp.float16
    assert np.max(np.abs(np.asarray(yh, np.float64) - value[normal])
                  / np.maximum(np.abs(value[normal]), 1e-30)) < 8e-3
    used.clear()
    x32 = jnp.asarray(x64, jnp.float32)
    np.testing.assert_array_equal(np.asarray(activations.gelu(x32)),
                                  np.asarray(keras_gelu(x32)))
    assert not used

    # The backward pass keeps x alone (autodiff of Keras' formula keeps more).
    def kept(fn):
        capsys.readouterr()
        print_saved_residuals(lambda z: jnp.sum(fn(z).astype(jnp.float32)), xb[:96])
        lines = capsys.readouterr().out.splitlines()
        return [m.group(0) for line in lines for m in [re.match(r"\w+\[[\d,]*\]", line)]
                if m and "[96]" in m.group(0)]

    assert kept(activations.gelu) == ["bf16[96]"]
    assert len(kept(keras_gelu)) > 1
    # ...and so does XLA: without a barrier, common-subexpression elimination merged the
    # backward's recomputation with the forward's (one exp in the compiled program, the
    # float32 Phi(x) kept for the backward: twice x's bytes, and more passes). The compile
    # of BERT-base's step for an H200 (bench/compile_for_gpu.py) showed it; on this CPU the
    # compiled forward and backward compute the exp twice, once in each pass.
    def forward_and_gradient(z, w):
        def loss(z):
            y = activations.gelu(z)
            return jnp.sum(y.astype(jnp.float32) * w), y
        return jax.value_and_grad(loss, has_aux=True)(z)

    z = jnp.asarray(np.resize(x, (64, 3072)))  # [tokens, intermediate]
    compiled = jax.jit(forward_and_gradient).lower(
        z, jnp.ones(z.shape, jnp.float32)).compile().as_text()
    assert compiled.count(" exponential(") == 2


@JAX_ONLY
def test_encoder_in_mixed_bfloat16_on_a_gpu_platform_runs_the_16_bit_gelu(monkeypatch):
    """BertEncoder's feed-forward layers take the kernel under mixed_bfloat16 (the
    attention kernels off), and the loss and gradients stay within bfloat16 noise of the
    CPU computation's."""
    import jax
    import jax.numpy as jnp

    from bert_keras import BertEncoder, kernels
    from bert_keras.layers import activations

    encoder = BertEncoder(vocab_size=50, num_layers=2, hidden_size=32, num_heads=2,
                          intermediate_size=64, dropout=0.0, attention_dropout=0.0,
                          max_sequence_length=16, dtype="mixed_bfloat16")
    rng = np.random.default_rng(1)
    inputs = {"input_word_ids": jnp.asarray(rng.integers(1, 50, (3, 12)), jnp.int32),
              "input_mask": jnp.asarray(np.arange(12)[None] < np.array([[12], [7], [3]]),
                                        jnp.int32),
              "input_type_ids": jnp.zeros((3, 12), jnp.int32)}
    trainable = [v.value for v in encoder.trainable_variables]

    def gradients():
        def loss(trainable):
            out, _ = encoder.stateless_call(trainable, [], inputs)
            return jnp.sum(out["sequence_output"].astype(jnp.float32) ** 2)
        return jax.value_and_grad(loss)(trainable)

    monkeypatch.setattr(kernels, "platform", lambda: "cpu")  # the reference: no kernel
    plain_loss, plain = gradients()
    used = []
    original = activations._gelu_16_bits
    monkeypatch.setattr(activations, "_gelu_16_bits",
                        lambda z: (used.append(z.shape), original(z))[1])
    monkeypatch.setattr(kernels, "platform", lambda: "gpu")
    monkeypatch.setenv(kernels.ENABLE_ENV, ",".join(kernels.UNMEASURED))
    monkeypatch.setenv(kernels.DISABLE_ENV, "flash_attention,cudnn_attention")
    kernel_loss, with_kernel = gradients()
    assert len(used) == 2 and used[0][-1] == 64  # one per layer, [B, S, intermediate]
    np.testing.assert_allclose(float(kernel_loss), float(plain_loss), rtol=2e-2)
    scale = max(float(np.max(np.abs(np.asarray(w)))) for w in plain)
    for got, want in zip(with_kernel, plain):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=5e-2,
                                   atol=2e-2 * scale)


@JAX_ONLY
def test_dense_bias_in_the_compute_dtype_on_a_gpu_platform(monkeypatch):
    """Kernel "dense_bias_16_bits": a mixed_bfloat16 Dense adds its bias in bfloat16 (the
    value of Keras' Dense: the bfloat16 product plus the bias rounded to bfloat16), its
    bias gradient stays the float32 sum over every row of the upstream gradient (against a
    float64 sum), the kernel's gradient is unchanged, and the product is no longer widened
    to float32 in the lowered program (what keeps XLA from moving the add into cuBLAS'
    epilogue)."""
    import jax
    import jax.numpy as jnp

    from bert_keras import kernels
    from bert_keras.layers.dense import Dense

    rows, units = 4096, 64
    layer = Dense(units, dtype="mixed_bfloat16")
    layer.build((None, 32))
    rng = np.random.default_rng(5)
    layer.bias.assign(rng.normal(size=units).astype(np.float32))
    x = jnp.asarray(rng.normal(size=(rows, 32)), jnp.bfloat16)
    # A mean of 0.5 makes each bias gradient a sum of about 2,000.
    upstream = jnp.asarray(rng.normal(size=(rows, units)) + 0.5, jnp.bfloat16)
    trainable = [v.value for v in layer.trainable_variables]  # kernel, bias

    def forward(trainable):
        # Called as a model calls it (its variables autocast), with these values.
        with keras.StatelessScope(state_mapping=list(zip(layer.trainable_variables,
                                                         trainable))):
            return layer(x)

    def new_step():  # a new function per platform: jit caches traces by function
        def step(trainable):
            def loss(trainable):
                out = forward(trainable)
                return jnp.sum(out.astype(jnp.float32) * upstream.astype(jnp.float32)), out
            return jax.value_and_grad(loss, has_aux=True)(trainable)
        return jax.jit(step)

    monkeypatch.setattr(kernels, "platform", lambda: "cpu")  # the reference: float32 add
    assert not kernels.applies("dense_bias_16_bits")
    (_, plain_out), plain = new_step()(trainable)
    plain_text = jax.jit(lambda t: forward(t)).lower(trainable).as_text()
    monkeypatch.setattr(kernels, "platform", lambda: "gpu")
    monkeypatch.setenv(kernels.ENABLE_ENV, "dense_bias_16_bits")
    assert kernels.applies("dense_bias_16_bits")
    (_, out), grads = new_step()(trainable)
    kernel_text = jax.jit(lambda t: forward(t)).lower(trainable).as_text()

    product = jnp.matmul(x, trainable[0].astype(jnp.bfloat16))
    np.testing.assert_array_equal(np.asarray(out, np.float32),
                                  np.asarray(product + trainable[1].astype(jnp.bfloat16),
                                             np.float32))
    assert out.dtype == plain_out.dtype == jnp.bfloat16
    # The float32 add rounds once, this one rounds the bias and the sum: they differ by up
    # to 2^-8 of the bias and 2^-8 of each result, within 2^-7 of |product| + |bias|.
    scale = np.abs(np.asarray(product, np.float32)) + np.abs(np.asarray(trainable[1]))
    assert np.all(np.abs(np.asarray(out, np.float32) - np.asarray(plain_out, np.float32))
                  <= 2 ** -7 * scale)
    want = np.asarray(upstream, np.float64).sum(axis=0)
    assert grads[1].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(grads[1]), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(plain[1]), want, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(grads[0]), np.asarray(plain[0]))
    widened = f"tensor<{rows}x{units}xf32>"
    assert widened in plain_text and widened not in kernel_text


@JAX_ONLY
def test_position_rows_as_a_one_hot_product_on_a_gpu_platform(monkeypatch):
    """Kernel "position_one_hot": the embeddings' values and gradients equal the sliced
    table's (float32 on a CPU; on an Ampere or newer GPU, JAX's default matmul precision
    rounds the rows to TF32, as it does every float32 Dense product), and the training
    step exported for CUDA sums no
    [B, S, H] tensor over its batch axis alone (the sliced table's gradient does)."""
    import jax
    import jax.numpy as jnp
    from jax import export

    from bert_keras import kernels
    from bert_keras.layers.embeddings import BertEmbeddings

    layer = BertEmbeddings(vocab_size=60, hidden_size=16, max_sequence_length=32,
                           dropout=0.0)
    layer.build()
    rng = np.random.default_rng(3)
    ids = jnp.asarray(rng.integers(0, 60, (5, 12)), jnp.int32)
    types = jnp.asarray(rng.integers(0, 2, (5, 12)), jnp.int32)
    upstream = jnp.asarray(rng.normal(size=(5, 12, 16)), jnp.float32)
    trainable = [v.value for v in layer.trainable_variables]

    def new_step():  # a new function per platform: jit caches traces by function
        def step(trainable, ids, types):
            def loss(trainable):
                out, _ = layer.stateless_call(trainable, [], ids, types, training=True)
                return jnp.sum(out * upstream), out
            return jax.value_and_grad(loss, has_aux=True)(trainable)
        return jax.jit(step)

    monkeypatch.setattr(kernels, "platform", lambda: "cpu")  # the reference: no kernel
    (_, plain_out), plain = new_step()(trainable, ids, types)
    monkeypatch.setattr(kernels, "platform", lambda: "gpu")
    monkeypatch.setenv(kernels.ENABLE_ENV, ",".join(kernels.UNMEASURED))
    (_, out), grads = new_step()(trainable, ids, types)
    np.testing.assert_allclose(np.asarray(out), np.asarray(plain_out), rtol=1e-6, atol=1e-6)
    for got, want in zip(grads, plain):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)

    def batch_sums(text):
        # reductions of a 5 x 12 x 16 operand over dimension 0 alone
        return re.findall(r"stablehlo.reduce\(%\S+ init: %\S+\) applies stablehlo.add across "
                          r"dimensions = \[0\] : \(tensor<5x12x16xf32>", text)

    sds = jax.ShapeDtypeStruct
    args = ([sds(t.shape, t.dtype) for t in trainable], sds((5, 12), jnp.int32),
            sds((5, 12), jnp.int32))
    with_kernel = export.export(new_step(), platforms=["cuda"])(*args).mlir_module()
    monkeypatch.setattr(kernels, "platform", lambda: "cpu")
    without = export.export(new_step(), platforms=["cuda"])(*args).mlir_module()
    assert batch_sums(without) and not batch_sums(with_kernel)
    # At inference (no gradient) the broadcast sum stays: no one-hot product.
    monkeypatch.setattr(kernels, "platform", lambda: "gpu")
    monkeypatch.setenv(kernels.ENABLE_ENV, ",".join(kernels.UNMEASURED))
    inference = export.export(
        jax.jit(lambda t, i, s: layer.stateless_call(t, [], i, s)[0]), platforms=["cuda"])(
        *args).mlir_module()
    assert "tensor<5x12x12xf32>" not in inference and "tensor<5x12x12xf32>" in with_kernel


def _layer_norm_64(x, residual, gamma, beta, epsilon):
    h = np.asarray(x, np.float64) + np.asarray(residual, np.float64)
    centered = h - h.mean(-1, keepdims=True)
    return centered / np.sqrt((centered ** 2).mean(-1, keepdims=True) + epsilon) * gamma + beta


@JAX_ONLY
def test_residual_layer_norm_kernel_against_float64_and_keras_gradients():
    """Rows of 48 (not a power of two: Triton's block of 64 is masked), three leading axes;
    float32 within float32 noise of float64, bfloat16 within its rounding; the gradients of
    all four inputs equal those of Keras' LayerNormalization of x + residual."""
    import jax
    import jax.numpy as jnp
    from bert_keras.residual_layer_norm import residual_layer_norm

    rng = np.random.default_rng(4)
    shape, epsilon = (2, 5, 3, 48), 1e-12
    x = rng.normal(size=shape) * 3 + 1
    residual = rng.normal(size=shape)
    gamma, beta = rng.normal(size=48), rng.normal(size=48)
    want = _layer_norm_64(x, residual, gamma, beta, epsilon)
    g32, b32 = jnp.asarray(gamma, jnp.float32), jnp.asarray(beta, jnp.float32)
    for dtype, bound in ((jnp.float32, 2e-6), (jnp.bfloat16, 2 ** -7)):
        xs, rs = jnp.asarray(x, dtype), jnp.asarray(residual, dtype)
        got = residual_layer_norm(xs, rs, g32, b32, epsilon, interpret=True)
        assert got.dtype == dtype and got.shape == shape
        # bfloat16: the inputs' rounding is part of the function computed; compare with
        # float64 of the rounded inputs.
        want_here = _layer_norm_64(np.asarray(xs, np.float64), np.asarray(rs, np.float64),
                                   gamma, beta, epsilon)
        scale = np.abs(want_here).max()
        assert np.abs(np.asarray(got, np.float64) - want_here).max() <= bound * scale
    assert np.abs(np.asarray(residual_layer_norm(jnp.asarray(x, jnp.float32),
                                                 jnp.asarray(residual, jnp.float32), g32,
                                                 b32, epsilon, interpret=True),
                             np.float64) - want).max() <= 2e-6 * np.abs(want).max()

    layer = keras.layers.LayerNormalization(epsilon=epsilon)
    layer.build(shape)
    weights = rng.normal(size=shape)

    def keras_loss(xs, rs, gs, bs):
        out, _ = layer.stateless_call([gs, bs], [], xs + rs)
        return jnp.sum(out * weights)

    def kernel_loss(xs, rs, gs, bs):
        return jnp.sum(residual_layer_norm(xs, rs, gs, bs, epsilon, interpret=True) * weights)

    args = (jnp.asarray(x, jnp.float32), jnp.asarray(residual, jnp.float32), g32, b32)
    ours = jax.grad(kernel_loss, argnums=(0, 1, 2, 3))(*args)
    theirs = jax.grad(keras_loss, argnums=(0, 1, 2, 3))(*args)
    for got, want_grad in zip(ours, theirs):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want_grad), rtol=1e-4,
                                   atol=1e-5 * float(np.abs(np.asarray(want_grad)).max()))
    with pytest.raises(ValueError, match="must match"):
        residual_layer_norm(args[0], args[1][..., :40], g32, b32, epsilon)

    # Lowered for CUDA (what runs on a GPU): one Triton call per LayerNorm at BERT-base's
    # rows, its operands and result in the row-major [rows, H] layout; the backward pass adds
    # no other kernel call.
    from jax import export

    rows = jax.ShapeDtypeStruct((256 * 128, 768), jnp.bfloat16)
    vector = jax.ShapeDtypeStruct((768,), jnp.float32)

    def step(xs, rs, gs, bs):
        return jnp.sum(residual_layer_norm(xs, rs, gs, bs, epsilon, interpret=False)
                       .astype(jnp.float32) ** 2)

    lowered = export.export(
        jax.jit(jax.grad(step, argnums=(0, 1, 2, 3))), platforms=["cuda"],
        disabled_checks=[export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(rows, rows, vector, vector).mlir_module()
    calls = [line for line in lowered.splitlines() if "stablehlo.custom_call" in line]
    assert len(calls) == 1 and 'name = "bert_residual_layer_norm"' in calls[0]
    assert "grid_x = 32768" in calls[0]
    assert ("operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : "
            "tensor<2xindex>" in calls[0])


@JAX_ONLY
def test_transformer_block_takes_the_residual_layer_norm_on_a_gpu_platform(monkeypatch):
    """Both LayerNorms of a block go through the kernel (attention kernels off), with the
    values and gradients of the unfused block (float32 noise)."""
    import jax
    import jax.numpy as jnp

    from bert_keras import kernels
    from bert_keras import residual_layer_norm as module
    from bert_keras.layers import TransformerEncoderBlock

    block = TransformerEncoderBlock(num_heads=2, intermediate_size=40, dropout=0.0,
                                    attention_dropout=0.0)
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(3, 7, 24)), jnp.float32)
    mask = jnp.asarray(np.arange(7)[None] < np.array([[7], [4], [2]]), jnp.int32)
    block(x, attention_mask=mask)
    trainable = [v.value for v in block.trainable_variables]

    def run():
        def loss(trainable, x):
            out, _ = block.stateless_call(trainable, [], x, attention_mask=mask)
            return jnp.sum(jnp.sin(out)), out
        (value, out), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
            trainable, x)
        return out, grads

    monkeypatch.setattr(kernels, "platform", lambda: "cpu")
    plain_out, plain_grads = run()
    used = []
    original = module.residual_layer_norm
    monkeypatch.setattr(module, "residual_layer_norm",
                        lambda *a, **k: (used.append(a[0].shape), original(*a, **k))[1])
    monkeypatch.setattr(kernels, "platform", lambda: "gpu")
    monkeypatch.setenv(kernels.ENABLE_ENV, "residual_layer_norm")
    monkeypatch.setenv(kernels.DISABLE_ENV, "flash_attention,cudnn_attention")
    fused_out, fused_grads = run()
    assert used == [(3, 7, 24), (3, 7, 24)]
    np.testing.assert_allclose(np.asarray(fused_out), np.asarray(plain_out), atol=2e-5)
    for got, want in zip(jax.tree_util.tree_leaves(fused_grads),
                         jax.tree_util.tree_leaves(plain_grads)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4,
                                   atol=1e-5 * max(1.0, float(np.abs(np.asarray(want)).max())))


@JAX_ONLY
def test_residual_layer_norm_under_a_batch_mesh_runs_on_each_devices_rows(monkeypatch):
    """Under Keras' DataParallel (a mesh splitting the batch) the kernel runs on each
    device's rows (`jax.shard_map`: XLA cannot split its custom call): values and the
    gradients of all four inputs equal the unsplit kernel's, the transformer block's
    LayerNorm hands it Keras' mesh, and its CUDA lowering's Triton call takes each
    device's rows."""
    if not _two_devices():
        pytest.skip("two JAX devices (XLA_FLAGS=--xla_force_host_platform_device_count=2)")
    import jax
    import jax.numpy as jnp
    from jax import export
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from bert_keras import kernels
    from bert_keras import residual_layer_norm as module
    from bert_keras.layers.layer_norm import LayerNorm

    mesh = Mesh(np.array(jax.devices()[:2]), ("batch",))
    rows = NamedSharding(mesh, PartitionSpec("batch"))
    rng = np.random.default_rng(11)
    shape, epsilon = (4, 6, 48), 1e-12
    x, residual = (jnp.asarray(rng.normal(size=shape), jnp.float32) for _ in range(2))
    gamma, beta = (jnp.asarray(rng.normal(size=48), jnp.float32) for _ in range(2))
    weights = jnp.asarray(rng.normal(size=shape), jnp.float32)

    def loss(mesh):
        return lambda *a: jnp.sum(module.residual_layer_norm(
            *a, epsilon, interpret=True, mesh=mesh, batch_axis="batch") * weights)

    split = [jax.device_put(t, rows) for t in (x, residual)] + [gamma, beta]
    got = jax.jit(jax.value_and_grad(loss(mesh), argnums=(0, 1, 2, 3)))(*split)
    want = jax.value_and_grad(loss(None), argnums=(0, 1, 2, 3))(x, residual, gamma, beta)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)  # sums in another order
    for g, w in zip(got[1], want[1]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5,
                                   atol=1e-6 * float(np.abs(np.asarray(w)).max()))

    monkeypatch.setattr(kernels, "platform", lambda: "gpu")
    monkeypatch.setenv(kernels.ENABLE_ENV, "residual_layer_norm")
    meshes = []
    original = module.residual_layer_norm
    monkeypatch.setattr(module, "residual_layer_norm", lambda *a, **kw: (
        meshes.append((kw.get("mesh"), kw.get("batch_axis"))), original(*a, **kw))[1])
    distribution = keras.distribution.DataParallel(devices=jax.devices()[:2])
    with distribution.scope():
        layer = LayerNorm(epsilon=epsilon)
        layer.build(shape)
        out = layer.call_with_residual(x, residual)
    [(layer_mesh, axis)] = meshes
    assert axis == distribution.batch_dim_name and layer_mesh.shape[axis] == 2
    np.testing.assert_allclose(np.asarray(out), np.asarray(
        original(x, residual, jnp.ones(48), jnp.zeros(48), epsilon, interpret=True)),
        rtol=1e-6, atol=1e-6)

    sds = jax.ShapeDtypeStruct

    def grid(mesh):
        def step(xs, rs, gs, bs):
            return jnp.sum(original(xs, rs, gs, bs, epsilon, interpret=False, mesh=mesh,
                                    batch_axis="batch").astype(jnp.float32) ** 2)

        big = sds((256, 128, 768), jnp.bfloat16, sharding=rows)
        vector = sds((768,), jnp.float32)
        text = export.export(jax.jit(jax.grad(step, argnums=(0, 1, 2, 3))), platforms=["cuda"],
                             disabled_checks=[export.DisabledSafetyCheck.custom_call(
                                 "__gpu$xla.gpu.triton")])(big, big, vector, vector).mlir_module()
        return re.findall(r"grid_x = (\d+)", text)

    assert grid(mesh) == [str(128 * 128)]  # each device's 128 of the 256 rows
    assert grid(None) == [str(256 * 128)]


@pytest.mark.integration  # this module in a fresh JAX process: ~45 s on 2 cores (the default suite's time)
def test_this_module_holds_on_jax():
    """The five tests above on Keras' JAX backend, in one fresh process."""
    run_module_on_backend("jax", __file__, 7, "-k", "not holds_on_jax", env=TWO_HOST_DEVICES)
