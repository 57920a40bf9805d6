"""The encoder export fine-tunes as TF Hub's BERT encoders do: `hub.KerasLayer(path,
trainable=True)` under tf_keras, and Keras 3's `keras.layers.TFSMLayer`, train the export's
variables as the Keras encoder trains its weights (the reference: the same head, optimizer
and batches on the BertEncoder itself), and training mode applies BERT's dropout."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from bert_keras import BertEncoder
from conftest import TINY, make_inputs
from export.export_encoder import export_encoder
from test_export import write_vocab

STEPS, LEARNING_RATE, LABELS = 3, 0.1, 2


def _batches():
    train = make_inputs(batch=6, seq=12, seed=1)
    labels = np.arange(6) % LABELS
    test = make_inputs(batch=4, seq=10, seed=2)
    return train, labels, test


def _head_kernel(hidden_size):
    return np.random.default_rng(3).normal(0, 0.2, (hidden_size, LABELS)).astype(np.float32)


def _fine_tune(encoder_call, train, labels, test, hidden_size, steps=STEPS):
    """Pooled output -> Dense head with a fixed start; SGD on the same batch `steps` times;
    returns the logits on `test`."""
    inputs = {name: keras.Input([None], dtype="int32", name=name) for name in train}
    head = keras.layers.Dense(LABELS, kernel_initializer=keras.initializers.Constant(
        _head_kernel(hidden_size)))
    model = keras.Model(inputs, head(encoder_call(inputs)["pooled_output"]))
    model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(train, labels, batch_size=len(labels), epochs=steps, shuffle=False, verbose=0)
    return np.asarray(model.predict(test, verbose=0))


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A dropout-free encoder (training equals inference, so fine-tuning is deterministic)
    and one with BERT's dropout, each exported; plus the Keras reference logits."""
    tmp = tmp_path_factory.mktemp("hub")
    vocab = write_vocab(tmp / "vocab.txt")
    keras.utils.set_random_seed(0)
    plain = BertEncoder(**TINY, dropout=0.0, attention_dropout=0.0)
    plain_path = export_encoder(plain, str(tmp / "plain"), vocab, warmup_seq_length=16)
    dropout = BertEncoder(**TINY)
    dropout_path = export_encoder(dropout, str(tmp / "dropout"), vocab, warmup_seq_length=16)
    train, labels, test = _batches()
    # Fine-tuning moves the Keras encoder's weights: the reference is computed last.
    reference = _fine_tune(lambda inputs: plain(inputs), train, labels, test, TINY["hidden_size"])
    return {"plain": plain_path, "dropout": dropout_path, "reference": reference, "tmp": tmp}


def test_the_export_carries_tf_hubs_reusable_api(exports):
    encoder = BertEncoder(**TINY)  # the same architecture: the weight count to expect
    loaded = tf.saved_model.load(exports["dropout"])
    assert sum(int(np.prod(v.shape)) for v in loaded.trainable_variables) == \
        encoder.count_params()
    assert len(loaded.trainable_variables) == len(encoder.trainable_weights)
    # The other variables are the dropout layers' seed states, one per Dropout layer.
    others = [v for v in loaded.variables if not v.trainable]
    dropouts = [layer for layer in encoder._flatten_layers()
                if isinstance(layer, keras.layers.Dropout)]
    assert len(others) == len(dropouts) > 0
    assert list(loaded.regularization_losses) == []
    # In the model's weight order, the same in every export (tracing order varied: weights
    # saved from one export's model did not load into another's).
    keras_encoder = BertEncoder(**TINY)
    assert [tuple(v.shape) for v in loaded.trainable_variables] == \
        [tuple(w.shape) for w in keras_encoder.trainable_weights]


def test_training_mode_draws_a_fresh_dropout_mask_and_inference_is_the_serving_function(
        exports):
    loaded = tf.saved_model.load(exports["dropout"])
    x = {k: tf.constant(v) for k, v in make_inputs(batch=3, seq=12).items()}
    serving = loaded.signatures["serving_default"](**x)["sequence_output"].numpy()
    inference = loaded(x)["sequence_output"].numpy()
    np.testing.assert_allclose(inference, serving, atol=1e-6)
    np.testing.assert_array_equal(loaded(x, training=False)["sequence_output"], inference)
    first = loaded(x, training=True)["sequence_output"].numpy()
    second = loaded.call_training(x)["sequence_output"].numpy()
    assert np.abs(first - inference).max() > 1e-2
    assert np.abs(second - first).max() > 1e-2
    # Without dropout, training mode is inference mode.
    plain = tf.saved_model.load(exports["plain"])
    np.testing.assert_allclose(plain(x, training=True)["sequence_output"],
                               plain(x)["sequence_output"], atol=1e-6)


def test_keras_tfsm_layer_fine_tunes_the_export_as_keras_fine_tunes_the_encoder(exports):
    train, labels, test = _batches()
    layer = keras.layers.TFSMLayer(exports["plain"], call_endpoint="__call__",
                                   call_training_endpoint="call_training")
    untrained = _fine_tune(layer, train, labels, test, TINY["hidden_size"], steps=0)
    logits = _fine_tune(layer, train, labels, test, TINY["hidden_size"])
    np.testing.assert_allclose(logits, exports["reference"], atol=2e-5)
    assert np.abs(logits - untrained).max() > 1e-2  # training moved it beyond the tolerance
    # With dropout, fit takes the training endpoint: every seed state advances.
    layer = keras.layers.TFSMLayer(exports["dropout"], call_endpoint="__call__",
                                   call_training_endpoint="call_training")
    before = [w.numpy().copy() for w in layer.non_trainable_weights]
    _fine_tune(layer, train, labels, test, TINY["hidden_size"])
    assert before and all(not np.array_equal(b, w.numpy())
                          for b, w in zip(before, layer.non_trainable_weights))


_HUB_SCRIPT = r"""
import json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is tf_keras, as hub.KerasLayer needs
import warnings
warnings.filterwarnings("ignore", "pkg_resources is deprecated")
import numpy as np
import tensorflow as tf
import tensorflow_hub as hub

path, data = sys.argv[1], np.load(sys.argv[2])
train = {k: data["train_" + k] for k in ("input_word_ids", "input_mask", "input_type_ids")}
test = {k: data["test_" + k] for k in train}
inputs = {k: tf.keras.Input([None], dtype=tf.int32, name=k) for k in train}
encoder = hub.KerasLayer(path, trainable=True)
head = tf.keras.layers.Dense(data["head"].shape[1],
                             kernel_initializer=tf.keras.initializers.Constant(data["head"]))
model = tf.keras.Model(inputs, head(encoder(inputs)["pooled_output"]))
model.compile(optimizer=tf.keras.optimizers.SGD(float(data["lr"])),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
seeds = [w.numpy().copy() for w in encoder.non_trainable_weights]
model.fit(train, data["labels"], batch_size=len(data["labels"]), epochs=int(data["steps"]),
          shuffle=False, verbose=0)
json.dump({"trainable": len(encoder.trainable_weights),
           "seeds_advanced": [not np.array_equal(s, w.numpy())
                              for s, w in zip(seeds, encoder.non_trainable_weights)],
           "logits": model.predict(test, verbose=0).tolist()}, sys.stdout)
"""


def _hub_fine_tune(path, tmp):
    pytest.importorskip("tensorflow_hub")
    pytest.importorskip("tf_keras")
    train, labels, test = _batches()
    data = tmp / "data.npz"
    np.savez(data, labels=labels, head=_head_kernel(TINY["hidden_size"]), lr=LEARNING_RATE,
             steps=STEPS, **{"train_" + k: v for k, v in train.items()},
             **{"test_" + k: v for k, v in test.items()})
    result = subprocess.run([sys.executable, "-c", _HUB_SCRIPT, path, str(data)],
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.integration
def test_tf_hub_keras_layer_fine_tunes_the_export_as_keras_fine_tunes_the_encoder(exports):
    """The route of TF Hub's "Classify text with BERT" tutorial: hub.KerasLayer(trainable=
    True) in a tf_keras model trains every weight of the export, like the Keras encoder."""
    plain = _hub_fine_tune(exports["plain"], exports["tmp"])
    assert plain["trainable"] == len(BertEncoder(**TINY).trainable_weights)
    np.testing.assert_allclose(plain["logits"], exports["reference"], atol=2e-5)
    # With BERT's dropout, tf_keras' fit calls the export in training mode.
    dropout = _hub_fine_tune(exports["dropout"], exports["tmp"])
    assert dropout["seeds_advanced"] and all(dropout["seeds_advanced"])


def test_the_reusable_call_checks_its_inputs_as_the_signatures_do(exports):
    """TF Hub's `obj(inputs, training=...)` (what hub.KerasLayer and TFSMLayer call, and a
    user's own model saved for TF Serving) ran the encoder on any ids: a negative word id
    read the table's last row, a type id past the segment table added no segment embedding
    (a one-segment model's second text read as zeros), and a batch-1 mask applied to every
    row, all without an error, where `serving_default` refuses each."""
    loaded = tf.saved_model.load(exports["dropout"])
    good = make_inputs(batch=2, seq=8)
    bad_word, bad_type = dict(good), dict(good)
    bad_word["input_word_ids"] = good["input_word_ids"].copy()
    bad_word["input_word_ids"][0, 1] = -1
    bad_type["input_type_ids"] = np.full_like(good["input_type_ids"], 2)
    bad_mask = dict(good, input_mask=good["input_mask"][:1])
    for inputs, message in ((bad_word, r"input_word_ids: ids must be in \[0, "),
                            (bad_type, r"input_type_ids: ids must be in \[0, 2\)"),
                            (bad_mask, r"input_mask must have the shape of input_word_ids")):
        x = {k: tf.constant(v) for k, v in inputs.items()}
        for call in (lambda: loaded(x), lambda: loaded(x, training=True),
                     lambda: loaded.call_training(x),
                     lambda: loaded.signatures["serving_default"](**x)):
            with pytest.raises(tf.errors.InvalidArgumentError, match=message):
                call()
    assert np.isfinite(loaded({k: tf.constant(v) for k, v in good.items()})
                       ["pooled_output"].numpy()).all()
    # Longer than the position table: the restored call's shapes were inferred for the
    # call and failed there ("Dimensions must be equal, but are 200 and 40"), a ValueError
    # before the check ran; now the check's InvalidArgumentError, as the signature gives.
    positions = TINY["max_sequence_length"]
    long = {k: tf.constant(np.tile(v[:, :1], (1, positions + 5))) for k, v in good.items()}
    for call in (lambda: loaded(long), lambda: loaded.call_training(long),
                 lambda: loaded.signatures["serving_default"](**long)):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=rf"input_word_ids: at most {positions} positions"):
            call()


def test_the_mlm_sub_object_is_tf_hubs_reusable_mlm(tmp_path):
    """TF Hub's BERT encoders exported with a masked LM (Model Garden's export_tfhub_lib)
    have `encoder.mlm`, a reusable object: `mlm(inputs, training=...)` with
    masked_lm_positions returns the encoder's outputs and mlm_logits, and has its own
    (trainable) variables. Ours was a function taking no `training` and holding no
    variables: hub.KerasLayer(obj.mlm, trainable=True) trained nothing."""
    from bert_keras import BertPretrainer

    keras.utils.set_random_seed(4)
    encoder = BertEncoder(**TINY)
    pretrainer = BertPretrainer(encoder)
    path = export_encoder(encoder, str(tmp_path / "m"), write_vocab(tmp_path / "vocab.txt"),
                          pretrainer=pretrainer, warmup_seq_length=16)
    loaded = tf.saved_model.load(path)
    x = make_inputs(batch=2, seq=10)
    x["masked_lm_positions"] = np.array([[1, 4, 7], [2, 3, 9]], np.int32)
    tensors = {k: tf.constant(v) for k, v in x.items()}
    out = loaded.mlm(tensors, training=False)
    reference = pretrainer(x)
    np.testing.assert_allclose(out["mlm_logits"], reference["mlm_logits"], atol=1e-4)
    np.testing.assert_allclose(out["mlm_logits"],
                               loaded.signatures["mlm"](**tensors)["mlm_logits"], atol=1e-5)
    plain = encoder({k: v for k, v in x.items() if k != "masked_lm_positions"})
    np.testing.assert_allclose(out["sequence_output"], plain["sequence_output"], atol=1e-5)
    np.testing.assert_allclose(out["pooled_output"], plain["pooled_output"], atol=1e-5)
    assert len(out["encoder_outputs"]) == TINY["num_layers"]
    # Its trainable variables are the encoder's and the masked-LM head's (the NSP head
    # plays no part), and every one gets a gradient from the masked-LM loss.
    shared = {w.path for w in encoder.weights}  # the head's output layer is tied to them
    head = [w for w in pretrainer.masked_lm.trainable_weights if w.path not in shared]
    assert len(loaded.mlm.trainable_variables) == len(encoder.trainable_weights) + len(head)
    assert list(loaded.mlm.regularization_losses) == []
    with tf.GradientTape() as tape:
        logits = loaded.mlm(tensors, training=True)["mlm_logits"]
        loss = tf.reduce_sum(tf.nn.log_softmax(logits)[..., 7])
    gradients = tape.gradient(loss, loaded.mlm.trainable_variables)
    missing = [v.name for v, g in zip(loaded.mlm.trainable_variables, gradients)
               if g is None and "pooler" not in v.name]
    assert missing == []
    assert np.abs(logits.numpy() - out["mlm_logits"].numpy()).max() > 1e-3  # dropout applied
    bad = dict(tensors, masked_lm_positions=tf.constant([[1, 10, 2], [0, 0, 0]]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"masked_lm_positions: positions"):
        loaded.mlm(bad)


def test_settings_a_tutorial_tokenizer_cannot_express_are_warned_of(tmp_path, caplog):
    """TF Hub's tutorials tokenize with tensorflow_text.BertTokenizer(vocab_file,
    lower_case=do_lower_case), which strips accents exactly when it lowercases: a Korean
    model (lowercased, accents kept) tokenized that way loses its Hangul to [UNK], without
    a word. The export says so, and where the settings are."""
    from data_prep.tokenizer_config import TokenizerConfig

    vocab = write_vocab(tmp_path / "vocab.txt")
    encoder = BertEncoder(**TINY)
    export_encoder(encoder, str(tmp_path / "plain"), vocab, warmup_seq_length=8)
    assert "TF Hub's BERT tutorials" not in caplog.text
    export_encoder(encoder, str(tmp_path / "korean"), vocab, warmup_seq_length=8,
                   settings=TokenizerConfig(do_lower_case=True, strip_accents=False))
    assert ("The tokenizer settings (do_lower_case=True, strip_accents=False, "
            "tokenize_chinese_chars=True) are not what a tokenizer built from the export's "
            "vocab_file and do_lower_case alone applies") in caplog.text
