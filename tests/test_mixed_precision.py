"""Mixed precision done right: no parameter's gradient is accumulated in bfloat16.

Under `mixed_bfloat16` the embedding layer reads its float32 tables as they are and casts
the sum of the lookups (bert_keras/layers/embeddings.py). These tests compile the training
step of a mixed_bfloat16 pretrainer with XLA (TensorFlow's `jit_compile`, and JAX) and read
its HLO for a bfloat16 scatter or reduction producing an embedding table's
gradient, with the old behaviour (tables autocast to bfloat16 before the lookup) as the
control that the check finds one; and they compare bfloat16-policy embedding gradients
with float32 ones on a batch where one token fills most positions.

Each test runs on both backends: in this process for the current one (TensorFlow under
`make test`) and in a subprocess for the other (conftest.run_on_backend).
"""

import re

import keras
import numpy as np
import pytest
from conftest import run_on_backend

from bert_keras import BertConfig, BertPretrainer
from bert_keras.layers import BertEmbeddings
from bert_keras.losses import pretraining_losses_and_metrics
from bert_keras.optimization import create_optimizer

# Sizes that all differ, so no other tensor has an embedding table's shape.
V, H, P_MAX, T, S, B, PREDICTIONS = 99, 32, 40, 2, 11, 5, 3
CONFIG = BertConfig(vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=37, max_position_embeddings=P_MAX, type_vocab_size=T,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# JAX in a subprocess under `make test` costs ~30 s a test: the integration tier.
BACKENDS = ["tensorflow", pytest.param("jax", marks=pytest.mark.integration)]


def _batch(seed=0, frequent_id=None):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, V, size=(B, S)).astype("int32")
    if frequent_id is not None:  # One token at 80% of the positions.
        ids = np.where(rng.random((B, S)) < 0.8, frequent_id, ids).astype("int32")
    types = (np.arange(S)[None, :] >= S // 2).astype("int32").repeat(B, 0)
    positions = np.sort(np.stack([rng.choice(np.arange(1, S), PREDICTIONS, replace=False)
                                  for _ in range(B)]), 1).astype("int32")
    x = {"input_word_ids": ids, "input_mask": np.ones((B, S), "int32"),
         "input_type_ids": types, "masked_lm_positions": positions}
    y = {"mlm_logits": rng.integers(5, V, size=(B, PREDICTIONS)).astype("int32"),
         "nsp_logits": rng.integers(0, 2, size=B).astype("int32")}
    w = {"mlm_logits": np.ones((B, PREDICTIONS), "float32"), "nsp_logits": np.ones(B, "float32")}
    return x, y, w


def _lookup_before_issue_41(self, input_word_ids, input_type_ids, training=None):
    """BertEmbeddings.call as it was: the tables autocast to the compute dtype (bfloat16),
    then looked up and summed."""
    words, types, positions = (keras.ops.cast(t, self.compute_dtype) for t in (
        self.word_embeddings, self.token_type_embeddings, self.position_embeddings))
    x = (keras.ops.take(words, input_word_ids, axis=0)
         + keras.ops.take(types, input_type_ids, axis=0)
         + positions[None, :keras.ops.shape(input_word_ids)[1], :])
    return self.dropout_layer(self.layer_norm(x), training=training)


def _pretrainer(policy):
    keras.utils.set_random_seed(7)  # The same initial weights under every policy.
    return BertPretrainer.from_bert_config(CONFIG, dtype=policy)


def train_step_hlo(model):
    """The HLO of the model's Keras train step as XLA receives it (before XLA's own passes,
    which on a CPU widen bfloat16 arithmetic to float32 and would hide what the program
    asks an accelerator to do)."""
    x, y, w = _batch()
    # One step builds the optimizer's and metrics' variables (on TensorFlow without XLA:
    # compiling the step below is what the test reads).
    model.compile(optimizer=create_optimizer(1e-3, 100, 10), jit_compile=False,
                  **pretraining_losses_and_metrics())
    model.fit(x, y, sample_weight=w, batch_size=B, epochs=1, verbose=0)
    if keras.backend.backend() == "jax":
        import jax

        state = ([v.value for v in model.trainable_variables],
                 [v.value for v in model.non_trainable_variables],
                 [v.value for v in model.optimizer.variables],
                 [v.value for v in model.metrics_variables])
        return jax.jit(model.train_step).lower(state, (x, y, w)).as_text(dialect="hlo")
    import tensorflow as tf

    step = tf.function(model.train_step, jit_compile=True)
    data = tf.nest.map_structure(tf.constant, (x, y, w))
    return step.experimental_get_compiler_ir(data)(stage="hlo")


_INSTRUCTION = re.compile(r"= (\w+)\[([\d,]*)\][^ ]* (scatter|reduce|reduce-window)\(")


def bf16_table_accumulations(hlo):
    """HLO instructions that scatter or reduce into bfloat16 with an embedding table's shape
    (the [V, H], [T, H], [P, H] tables, the [S, H] rows of positions used, or any of them
    flattened)."""
    shapes = {(V, H), (T, H), (P_MAX, H), (S, H)}
    sizes = {a * b for a, b in shapes}
    found = []
    for match in _INSTRUCTION.finditer(hlo):
        dtype, dims, opcode = match.groups()
        shape = tuple(int(d) for d in dims.split(",") if d)
        if dtype == "bf16" and (shape in shapes or (len(shape) == 1 and shape[0] in sizes)):
            found.append(f"{opcode} -> {dtype}{list(shape)}")
    return found


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_embedding_gradient_is_accumulated_in_bfloat16(backend, monkeypatch):
    if run_on_backend(backend, __file__, f"test_no_embedding_gradient_is_accumulated_in_"
                                         f"bfloat16[{backend}]"):
        return
    hlo = train_step_hlo(_pretrainer("mixed_bfloat16"))
    assert "bf16" in hlo  # The step does run in bfloat16.
    assert bf16_table_accumulations(hlo) == []
    if backend == "tensorflow":
        # TensorFlow's lowering to XLA sums bfloat16 in float32 and casts the lookup's
        # sparse gradient to float32 before densifying it: the old code was safe here.
        return
    # Control: with the tables autocast before the lookup, the check finds the bf16
    # scatter-adds into [V, H] and [T, H] and the position rows' bf16 sum over the batch.
    model = _pretrainer("mixed_bfloat16")
    monkeypatch.setattr(BertEmbeddings, "call", _lookup_before_issue_41)
    control = bf16_table_accumulations(train_step_hlo(model))
    assert sorted(control) == sorted([f"scatter -> bf16[{V}, {H}]", f"scatter -> bf16[{T}, {H}]",
                                      f"reduce -> bf16[{S}, {H}]",
                                      f"reduce -> bf16[{S}, {H}]"]), control


def _table_gradients(model, x):
    """Gradients of sum(sequence_output * R) for a fixed random R, for the three tables."""
    encoder = model.encoder
    layer = encoder.embeddings_layer
    tables = [layer.word_embeddings, layer.token_type_embeddings, layer.position_embeddings]
    weights = np.random.default_rng(3).normal(size=(B, S, H)).astype("float32")
    inputs = {k: x[k] for k in ("input_word_ids", "input_mask", "input_type_ids")}
    if keras.backend.backend() == "jax":
        import jax

        trainable = [v.value for v in encoder.trainable_variables]
        non_trainable = [v.value for v in encoder.non_trainable_variables]
        index = [next(i for i, v in enumerate(encoder.trainable_variables) if v is t)
                 for t in tables]

        def objective(trainable):
            out, _ = encoder.stateless_call(trainable, non_trainable, inputs)
            return (out["sequence_output"].astype("float32") * weights).sum()

        grads = jax.grad(objective)(trainable)
        return [np.asarray(grads[i], np.float32) for i in index]
    import tensorflow as tf

    with tf.GradientTape() as tape:
        out = encoder(inputs)["sequence_output"]
        objective = tf.reduce_sum(tf.cast(out, tf.float32) * weights)
    return [np.asarray(tf.convert_to_tensor(g), np.float32)
            for g in tape.gradient(objective, [t.value for t in tables])]


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_embedding_gradients_match_float32(backend):
    if run_on_backend(backend, __file__,
                      f"test_bfloat16_embedding_gradients_match_float32[{backend}]"):
        return
    frequent = 7
    x, _, _ = _batch(seed=1, frequent_id=frequent)
    reference = _table_gradients(_pretrainer("float32"), x)
    mixed = _table_gradients(_pretrainer("mixed_bfloat16"), x)
    for name, got, want in zip(("word", "type", "position"), mixed, reference):
        assert got.dtype == np.float32
        error = np.linalg.norm(got - want) / np.linalg.norm(want)
        # bfloat16 activations (8-bit mantissa, relative rounding 2^-9) through two layers
        # give a few 1e-3; a sum of the frequent token's 44 contributions rounded at every
        # addition would add up to 44 x 2^-9 = 9% to that row.
        assert error < 2e-2, (name, error)
    row_error = (np.linalg.norm(mixed[0][frequent] - reference[0][frequent])
                 / np.linalg.norm(reference[0][frequent]))
    assert row_error < 2e-2, row_error
