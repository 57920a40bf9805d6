"""finetuning.loop: the interval loss the log shows, and the step count the run uses."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from bert_keras.backup import StopAtStep
from bert_keras.finetuning import loop


@pytest.mark.parametrize("epochs", [1, 3])
def test_step_logger_reports_the_mean_of_each_interval(epochs):
    """With a zero learning rate every batch's loss is fixed, so each logged value can be
    checked against the mean of that interval's batch losses computed independently. In
    several epochs (a backed-up run's intervals) Keras' running mean restarts at each
    epoch, and the intervals 4-6 and 7-9 cross an epoch's end (4 steps an epoch)."""
    rng = np.random.default_rng(0)
    batch, steps, every = 5, 11, 4
    x = rng.normal(size=(batch * steps, 3)).astype("float32")
    # Targets drift with the index, so batch losses differ and a running mean since step 1
    # is far from the mean of the last interval.
    y = (np.arange(batch * steps) / 5.0).astype("float32")[:, None]
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    logger = loop.StepLogger(total_steps=steps, every=every if epochs == 1 else 3)
    if epochs == 1:
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0,
                  callbacks=[logger])
        intervals = [(0, 4), (4, 8), (8, 11)]
    else:
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
        model.fit(ds, epochs=epochs, steps_per_epoch=4, verbose=0, shuffle=False,
                  callbacks=[logger, StopAtStep(steps)])
        intervals = [(0, 3), (3, 6), (6, 9), (9, 11)]

    predictions = np.asarray(model.predict_on_batch(x))
    per_batch = ((predictions - y) ** 2).reshape(steps, batch).mean(axis=1)
    assert [h["step"] for h in logger.history] == [end for _, end in intervals]
    for h, (begin, end) in zip(logger.history, intervals):
        np.testing.assert_allclose(h["loss"], per_batch[begin:end].mean(), rtol=1e-4)
        assert h["learning_rate"] == 0.0
    # Not the running mean since step 1.
    assert abs(logger.history[-1]["loss"] - per_batch.mean()) > 1.0


def plain_model(monkeypatch):
    """(model, x, y): a one-layer model on 24 examples that `loop.train` trains (its loss
    given directly: compile_args knows only the task models)."""
    inputs = keras.Input((2,), name="a")
    model = keras.Model({"a": inputs}, {"logits": keras.layers.Dense(3)(inputs)})
    x = {"a": np.ones((24, 2), "float32")}
    y = {"logits": np.zeros((24,), "int32")}
    monkeypatch.setattr(loop, "compile_args", lambda m, token_weighted=False: {
        "loss": {"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}})
    return model, x, y


def test_num_train_steps_overrides_epochs(monkeypatch):
    model, x, y = plain_model(monkeypatch)
    seen = []

    class Count(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(batch)

    by_epochs = loop.train(model, x, y, batch_size=4, num_train_epochs=2.0,
                           learning_rate=1e-3, warmup_proportion=0.5, callbacks=[Count()])
    assert by_epochs["num_train_steps"] == 12 and by_epochs["num_warmup_steps"] == 6
    assert len(seen) == 12
    seen.clear()
    by_steps = loop.train(model, x, y, batch_size=4, num_train_epochs=2.0, learning_rate=1e-3,
                          warmup_proportion=0.5, num_train_steps=5, callbacks=[Count()])
    assert by_steps["num_train_steps"] == 5 and by_steps["num_warmup_steps"] == 2
    assert len(seen) == 5 and by_steps["loss_history"][-1]["step"] == 5
    # Steady-state speed leaves out the first step (tracing), so it is the faster figure.
    assert by_steps["steady_examples_per_second"] > by_steps["examples_per_second"]


def test_predict_pads_the_last_batch_instead_of_tracing_again():
    traces = []

    class CountTraces(keras.layers.Layer):
        def call(self, x):
            traces.append(tuple(x.shape))  # Python runs only while tracing
            return x * 2.0

    inputs = keras.Input((3,), name="a")
    model = keras.Model({"a": inputs}, {"out": keras.layers.Dense(2)(CountTraces()(inputs))})
    x = {"a": np.random.default_rng(0).normal(size=(10, 3)).astype("float32")}
    traces.clear()
    outputs, timing = loop.predict(model, x, batch_size=4)  # batches of 4, 4, 2 (+2 padding)
    assert len(traces) == 1  # one trace for every batch (unpadded, the last would add one)
    expected = np.asarray(model({"a": x["a"]})["out"])
    np.testing.assert_allclose(outputs["out"], expected, rtol=1e-5, atol=1e-6)
    assert outputs["out"].shape == (10, 2) and timing["examples_per_second"] > 0
    traces.clear()
    short, _ = loop.predict(model, {"a": x["a"][:3]}, batch_size=4)  # one short batch
    assert len(traces) == 1  # not padded: a new shape, traced again
    np.testing.assert_allclose(short["out"], expected[:3], rtol=1e-5, atol=1e-6)


def test_the_shuffled_stream_is_the_same_for_every_iterator():
    """Every pass a permutation of its own, and a second iterator (Keras' fit under a
    tf.distribute strategy makes two) yields the same stream as the first."""
    x = {"ids": np.arange(10, dtype=np.int32)[:, None]}
    ds = loop.make_dataset(x, None, 5, shuffle=True, seed=4, repeat=True, drop_remainder=True)
    streams = [[int(i) for batch in ds.take(6) for i in batch["ids"].numpy().ravel()]
               for _ in range(2)]
    assert streams[0] == streams[1]
    passes = [streams[0][k:k + 10] for k in (0, 10, 20)]
    assert all(sorted(p) == list(range(10)) for p in passes)
    assert passes[0] != passes[1] != passes[2] and passes[0] != list(range(10))
