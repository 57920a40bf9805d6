"""SelfAttention: BERT's multi-head scaled dot-product self-attention with a padding mask."""

import math

import keras
from keras import ops

from bert_keras import kernels
from bert_keras.layers import padding_free
from bert_keras.layers.activations import clone_initializer
from bert_keras.layers.dense import Dense
from bert_keras.layers.dropout import Dropout

# Added to attention scores at padded key positions in the explicit softmax. Google's code
# adds -10000: exp(-10000 + s) underflows to exactly 0 in float32, so padded keys get zero
# weight. But a row with no real key (a padding example) then attends by its raw scores,
# where transformers (adding finfo.min) and the fused path (keras.ops.dot_product_attention,
# a select) attend uniformly. s - 1e30 rounds to -1e30 in float32 for any |s| < 3e22, so
# such a row's scores are all equal and its softmax uniform too: every path on CPUs, on
# both backends, computes transformers' function for any mask.
_MASK_ADDEND = -1e30
# The key bias of the GPU's Pallas kernel (bert_keras.flash_attention), Google's -10000: the
# kernel pads keys with a lower bias of its own, and keeps each row's log-sum-exp for the
# backward pass, which -1e30 would swamp. There, a row with no real key attends by its
# raw scores (and cuDNN's, to its first key): padding examples, whose outputs no loss counts.
_KERNEL_KEY_BIAS = -10000.0


def _float16_on_jax_cpu(q) -> bool:
    """Whether `q` is float16 on JAX's CPU backend, where `keras.ops.dot_product_attention`
    does not compile ("The precision 'F16_F16_F32' is not supported by dot_general on CPU":
    XLA's CPU backend has no float16 product with float32 accumulation). The explicit
    softmax computes the same function there (its products accumulate in float16, as the
    training step's do), so mixed_float16 evaluates and predicts as it trains."""
    return (kernels.platform() == "cpu"
            and keras.backend.standardize_dtype(q.dtype) == "float16")


def _sixteen_bits_on_tensorflow_cpu(q) -> bool:
    """Whether `q` is bfloat16 or float16 on TensorFlow in a process with no GPU or TPU.
    There TensorFlow's 16-bit (batch) matrix products lose precision inside their sums:
    with BERT-base's attention (S128, D64) under mixed_bfloat16, `keras.ops.
    dot_product_attention`'s einsums took the attention's output 5.3e-2 (relative) from
    float64's on the same rounded q, k and v, and batch matmuls 1.2e-2, where
    transformers' bfloat16 attention is 1.0e-2 off and JAX's 3.8e-3 (mixed_float16: 8.4e-3,
    torch 7.7e-4), on a 2-core AVX2 CPU without oneDNN (bench/attention_precision.py,
    BUILD_NOTES.md 8.10). So the explicit softmax runs there,
    its two products on float32 operands (as fast there: bfloat16 is emulated), as the
    class docstring promises (tests/test_attention.py). TensorFlow on a GPU or TPU keeps
    its products in 16 bits (their sums accumulate in float32), and so do serving copies
    (`explicit_softmax`)."""
    if (keras.backend.backend() != "tensorflow"
            or keras.backend.standardize_dtype(q.dtype) not in ("bfloat16", "float16")):
        return False
    import tensorflow as tf

    return not (tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))


def check_attention_mask(attention_mask, x_shape, layer):
    """Raises a one-line ValueError unless `attention_mask` is a [B, S] key mask whose
    static sizes match `x_shape` ([B, S, H]; None: check the rank only). Every path masks
    keys only (the GPU kernels take a [B, S] key bias or key lengths), so a [B, Q, S] or
    [B, 1, 1, S] mask would otherwise fail deep inside with a message about einsums or
    transposes, or, in the padding-free path, pick wrong rows."""
    if attention_mask is None or getattr(attention_mask.shape, "rank", 0) is None:
        return  # None, or a TensorFlow tensor of unknown rank (checked when it runs)
    shape = tuple(attention_mask.shape)
    expected = "[B, S]" if x_shape is None else f"[B, S] = {tuple(x_shape[:2])}"
    if len(shape) != 2 or (x_shape is not None and any(
            a is not None and b is not None and a != b for a, b in zip(shape, x_shape[:2]))):
        hint = (" (a [B, S, S] mask built from an input_mask, as Google's "
                "create_attention_mask_from_input_mask does, is that input_mask broadcast: "
                "pass the input_mask)" if len(shape) == 3 else "")
        raise ValueError(
            f"{layer}: attention_mask must be {expected}, 1 for real tokens and 0 for "
            f"padding (BERT's input_mask; the same key mask for every query and head); got "
            f"shape {shape}{hint}")


@keras.saving.register_keras_serializable(package="bert_keras")
class SelfAttention(keras.layers.Layer):
    """Multi-head self-attention (Vaswani et al. 2017), as in BERT's `attention/self` scope.

    Shapes: B = batch, S = sequence length, H = hidden size, N = heads, D = H / N.

    The query, key and value projections are Dense layers with [H, H] kernels (Google's
    checkpoint layout), so weights convert by name with no reshape. Scores are softmaxed in
    float32 even under a mixed-precision policy (16-bit products sum in float32; on
    TensorFlow's CPUs, whose 16-bit products do not, they take float32 operands, but in
    serving copies).

    Which computation runs (all compute the same function; tests/test_attention.py and
    tests/test_flash_attention.py):
      - JAX on a GPU (bert_keras.kernels "flash_attention"): fused kernels in the
        projections' [B, S, N, D] layout (bert_keras.flash_attention). Where no
        probability is dropped, cuDNN's flash attention, a right-padded mask passed as key
        lengths; in training with attention dropout, a Pallas flash-attention kernel that
        draws the dropout decisions in registers and regenerates them in the backward
        pass, so the [B, N, Q, S] probabilities never reach memory.
      - Elsewhere, where no probability is dropped (inference, `dropout=0`):
        `keras.ops.dot_product_attention` (XLA's fusion, or TensorFlow's ops), but for
        float16 on JAX's CPU backend, where it does not compile (`_float16_on_jax_cpu`),
        16 bits on TensorFlow's CPUs, where its products are imprecise
        (`_sixteen_bits_on_tensorflow_cpu`), and with `explicit_softmax=True` (serving
        copies, what exports run).
      - Elsewhere, in training with attention dropout, float16 on JAX's CPU backend, 16
        bits on TensorFlow's CPUs and with `explicit_softmax=True`: the softmax written
        out, dropout on the probabilities (Google's computation; in serving copies
        nothing is dropped: on TensorFlow without XLA it is the faster of the two at long
        requests).

    Args:
      num_heads: N.
      dropout: dropout rate on attention probabilities (BERT drops whole attention links).
      initializer: kernel initializer of the projections.
      kernel_layout: the projections' kernel layout (`bert_keras.layers.dense.Dense`):
        "in_out" (Google's checkpoints, training, the task exports' default) or "out_in"
        (`--kernel_layout=out_in` exports).
      explicit_softmax: where nothing is dropped and no fused GPU kernel applies, run the
        softmax written out rather than `keras.ops.dot_product_attention` (serving
        copies, `bert_keras.tasks.for_serving`). The same function either way.
    """

    def __init__(self, num_heads, dropout=0.1, initializer="truncated_normal",
                 kernel_layout="in_out", explicit_softmax=False, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(num_heads, int) or num_heads <= 0:
            raise ValueError(f"`num_heads` must be a positive integer. Received: {num_heads!r}")
        if not isinstance(explicit_softmax, bool):
            raise ValueError("`explicit_softmax` must be True or False. "
                             f"Received: {explicit_softmax!r}")
        self.num_heads = num_heads
        self.dropout = dropout
        self.initializer = keras.initializers.get(initializer)
        self.kernel_layout = kernel_layout
        self.explicit_softmax = explicit_softmax
        self.dropout_layer = Dropout(dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        hidden_size = input_shape[-1]
        if hidden_size % self.num_heads:
            raise ValueError(
                f"Hidden size {hidden_size} is not divisible by num_heads={self.num_heads}."
            )
        self.head_size = hidden_size // self.num_heads

        def dense(name):
            layer = Dense(
                hidden_size,
                kernel_initializer=clone_initializer(self.initializer),
                kernel_layout=self.kernel_layout,
                name=name,
                dtype=self.dtype_policy,
            )
            layer.build(input_shape)
            return layer

        self.query = dense("query")
        self.key = dense("key")
        self.value = dense("value")
        self.built = True

    def _split_heads(self, x, batch_size, seq_length):
        # [B, S, H] -> [B, S, N, D]
        return ops.reshape(x, (batch_size, seq_length, self.num_heads, self.head_size))

    def call(self, x, attention_mask=None, training=None, query=None, rows=None, slots=None):
        """Attends every query position to every unmasked position of `x`.

        Args:
          x: float Tensor of shape [B, S, H], the sequence attended to (keys and values);
            with `rows`, float Tensor [T, H] of the real tokens only.
          attention_mask: int, float or bool Tensor of shape [B, S], 1 for real tokens and 0
            for padding (the `input_mask` of BERT), or None for no masking. Any pattern
            (right or left padding, holes, a row with no real token); another shape is a
            one-line ValueError (`check_attention_mask`).
          training: Python bool, whether dropout is active.
          query: optional float Tensor [B, Q, H], the vectors that attend (their queries);
            None means `x` itself (Q = S). A subset of `x`'s rows gives exactly those rows
            of the full output, at Q/S of the cost of the queries' share of the work.
          rows: optional int32 Tensor [T] from `padding_free.real_rows(attention_mask)`:
            `x` holds those rows of the flattened [B * S, H] batch. The projections run on
            the T rows, attention on the padded layout (zeros at padded positions, which
            the mask hides), and the output is the T rows again (TensorFlow only).
          slots: with `rows` from `padding_free.packed_rows` (`x` is then [C, H], C >= T
            rows at a static shape): each of the B * S positions' row of `x`. The padded
            layout is gathered through `slots` rather than scattered (any backend).

        Returns:
          float Tensor of shape [B, Q, H], the heads' context vectors concatenated (before
          the output projection, which lives in the transformer block); [T, H] with `rows`.
        """
        check_attention_mask(attention_mask, None if rows is not None else tuple(x.shape),
                             "SelfAttention")
        if rows is not None:
            return self._call_on_rows(x, attention_mask, training, rows, slots)
        if query is None:
            query = x
        batch_size, seq_length = ops.shape(x)[0], ops.shape(x)[1]
        query_length = ops.shape(query)[1]
        q = self._split_heads(self.query(query), batch_size, query_length)  # [B, Q, N, D]
        k = self._split_heads(self.key(x), batch_size, seq_length)  # [B, S, N, D]
        v = self._split_heads(self.value(x), batch_size, seq_length)  # [B, S, N, D]
        context = self._attend(q, k, v, attention_mask, training)  # [B, Q, N, D]
        return ops.reshape(context, (batch_size, query_length, self.num_heads * self.head_size))

    def _call_on_rows(self, x, attention_mask, training, rows, slots=None):
        batch_size, seq_length = ops.shape(attention_mask)[0], ops.shape(attention_mask)[1]
        num_rows = batch_size * seq_length

        def padded_heads(projection):
            # [T, H] -> [B * S, H] (zeros at padding; with slots, row 0 there) -> [B, S, N, D]
            if slots is None:
                padded = padding_free.scatter_rows(projection(x), rows, num_rows)
            else:
                padded = ops.take(projection(x), slots, axis=0)
            return self._split_heads(padded, batch_size, seq_length)

        q, k, v = padded_heads(self.query), padded_heads(self.key), padded_heads(self.value)
        context = self._attend(q, k, v, attention_mask, training)  # [B, S, N, D]
        context = ops.reshape(context, (num_rows, self.num_heads * self.head_size))
        if slots is not None:
            return ops.take(context, rows, axis=0)  # [C, H]
        return padding_free.gather_rows(context, rows)  # [T, H]

    def _attend(self, q, k, v, attention_mask, training):
        """Scaled dot-product attention: [B, Q, N, D] queries over [B, S, N, D] keys and
        values -> [B, Q, N, D]. Every path takes and returns the projections' layout."""
        scale = 1.0 / math.sqrt(self.head_size)
        rate = self.dropout if training else 0.0
        if kernels.applies("flash_attention"):
            # JAX on a GPU (bert_keras.flash_attention): fused kernels, no [B, N, Q, S]
            # tensor in memory, no layout change.
            from bert_keras import flash_attention

            query_length, key_length = ops.shape(q)[1], ops.shape(k)[1]
            if flash_attention.supports(query_length, key_length, self.head_size):
                key_mask = (ops.ones(ops.shape(k)[:2], "int32") if attention_mask is None
                            else ops.cast(attention_mask, "int32"))
                # cuDNN where every position attends (it refused the pretrainer's last
                # layer, which attends from [CLS] and the P masked positions only: Q = 21,
                # on an H200 with JAX 0.11.2) in 16 bits; the Pallas kernel elsewhere
                # (float32 included, which cuDNN refuses).
                if (rate == 0 and query_length == key_length
                        and flash_attention.cudnn_supports(self.head_size, q.dtype)
                        and kernels.applies("cudnn_attention")):
                    return flash_attention.cudnn_attention(
                        q, k, v, key_mask, scale=scale,
                        key_lengths=kernels.applies("cudnn_key_lengths"))
                key_bias = (1.0 - ops.cast(key_mask, "float32")) * _KERNEL_KEY_BIAS
                seed = self.dropout_layer.seed_generator.next() if rate else None
                # Under Keras' DataParallel the kernels run on each device's rows.
                mesh, batch_axis = kernels.batch_mesh()
                return flash_attention.attention(q, k, v, key_bias, seed, dropout_rate=rate,
                                                 scale=scale, mesh=mesh, batch_axis=batch_axis)
        if (rate == 0 and not self.explicit_softmax and not _float16_on_jax_cpu(q)
                and not _sixteen_bits_on_tensorflow_cpu(q)):
            # Nothing to drop: XLA's fused attention. [B, S] -> [B, 1, 1, S]: the same key
            # mask for every head and query. On a GPU (head sizes over 256, or the fused
            # kernels switched off) Keras would try cuDNN with that mask, which cuDNN
            # refuses ("Failed to apply" in the log): XLA's directly.
            mask = None if attention_mask is None else ops.cast(
                attention_mask, "bool")[:, None, None, :]
            unfused = {"flash_attention": False} if kernels.platform() == "gpu" else {}
            return ops.dot_product_attention(q, k, v, mask=mask, scale=scale, **unfused)
        # Serving copies (explicit_softmax, `tasks.for_serving`; exports run them on
        # TensorFlow without XLA) take the explicit softmax even with nothing to drop: there
        # `keras.ops.dot_product_attention` runs oneDNN's einsum twice and selects over the
        # [B, N, Q, S] scores with a broadcast boolean mask; the explicit path's two batch
        # matmuls and additive [B, 1, 1, S] mask took 0.70-0.78x the time of a base layer's
        # attention without its projections at 256-384 positions on a 2-core Xeon
        # (bench/bench_long_attention.py, BUILD_NOTES.md section 8.11).
        return self._explicit_attention(q, k, v, attention_mask, scale, training)

    def _explicit_attention(self, q, k, v, attention_mask, scale, training):
        """The softmax written out, with dropout on the [B, N, Q, S] probabilities (CPUs,
        and the reference of the fused paths)."""
        # Serving copies keep 16-bit products: `--serving_dtype=bfloat16` trades that
        # precision for speed (AMX), measured in BUILD_NOTES.md section 8.11.
        float32_products = not self.explicit_softmax and _sixteen_bits_on_tensorflow_cpu(q)
        if float32_products:
            q, k, v = (ops.cast(t, "float32") for t in (q, k, v))
        q, k, v = (ops.transpose(t, (0, 2, 1, 3)) for t in (q, k, v))  # [B, N, *, D]
        # [B, N, Q, D] x [B, N, D, S] -> [B, N, Q, S], in float32 for a stable softmax.
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2)))
        scores = ops.cast(scores, "float32") * scale
        if attention_mask is not None:
            # [B, S] -> [B, 1, 1, S]: the same key mask for every head and query.
            mask = ops.cast(attention_mask, "float32")[:, None, None, :]
            scores = scores + (1.0 - mask) * _MASK_ADDEND
        probs = ops.softmax(scores, axis=-1)
        probs = ops.cast(probs, self.compute_dtype)
        probs = self.dropout_layer(probs, training=training)
        if float32_products:
            return ops.cast(ops.transpose(ops.matmul(ops.cast(probs, "float32"), v),
                                          (0, 2, 1, 3)), self.compute_dtype)
        return ops.transpose(ops.matmul(probs, v), (0, 2, 1, 3))  # [B, Q, N, D]

    def compute_output_shape(self, x_shape, attention_mask_shape=None, query_shape=None):
        return tuple(x_shape if query_shape is None else query_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "dropout": self.dropout,
                "initializer": keras.initializers.serialize(self.initializer),
                "kernel_layout": self.kernel_layout,
                "explicit_softmax": self.explicit_softmax,
            }
        )
        return config
