"""The fine-tuning loop every task shares: tf.data over arrays, `fit` with BERT's optimizer,
and batched prediction, with the step counts and timings the results files report.

Google's step count: num_train_steps = int(N / (batch_size x k) * num_train_epochs) updates
on full batches (drop_remainder, static shapes), warmup = int(steps * warmup_proportion), N
the examples an epoch counts (the training rows, or run_squad's questions: `epoch_size`), k
the micro-batches of `batch_size` averaged into one update (gradient accumulation; 1 for
none); an explicit num_train_steps replaces the epoch count. Every step counted (the
schedule, backups, logs) is an update.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from bert_keras import backends
from bert_keras.backup import (BackupError, ExactBackupAndRestore, StopAtStep,
                               StopOnNonFiniteLoss, updates_done)
from bert_keras.optimization import create_optimizer
from bert_keras.tasks import averages_over_tokens, compile_args
from data_prep.schema import IGNORE_LABEL


def num_examples(x: Mapping[str, np.ndarray]) -> int:
    return len(next(iter(x.values())))


def make_dataset(x: dict, y: dict | None, batch_size: int, shuffle: bool = False,
                 seed: int = 0, repeat: bool = False, drop_remainder: bool = False) -> tf.data.Dataset:
    """tf.data over in-memory arrays (all int32 [N, ...]); deterministic for a seed.

    Shuffled, every pass over the data has its own order, a pure function of (seed, pass):
    every iterator of the dataset yields the same stream. (With reshuffle_each_iteration the
    stream depended on how many iterators had been made before, and Keras' fit under a
    tf.distribute strategy makes two, so --distribution_strategy=mirrored trained on another
    order than one device did.)

    Autotune is off and prefetch fixed: with autotune, `fit` can wait seconds for a
    background thread after its last step (docs/DESIGN.md section 9).
    """
    data = (x, y) if y is not None else x
    if shuffle:
        n = num_examples(x)
        passes = tf.data.Dataset.counter() if repeat else tf.data.Dataset.range(1)
        order = passes.map(lambda p: tf.random.experimental.stateless_shuffle(
            tf.range(n, dtype=tf.int64), seed=tf.stack([tf.constant(seed, tf.int64), p])))
        tensors = tf.nest.map_structure(tf.constant, data)
        ds = order.unbatch().map(
            lambda i: tf.nest.map_structure(lambda t: tf.gather(t, i), tensors))
    else:
        ds = tf.data.Dataset.from_tensor_slices(data)
        if repeat:
            ds = ds.repeat()
    ds = ds.batch(batch_size, drop_remainder=drop_remainder).prefetch(2)
    options = tf.data.Options()
    options.autotune.enabled = False
    options.deterministic = True
    return ds.with_options(options)


def weigh_labelled_tokens(ds: tf.data.Dataset, accumulation: int) -> tf.data.Dataset:
    """Micro-batches `(x, y)` -> `(x, y, sample_weight)`: every token of the `accumulation`
    consecutive micro-batches of one update weighs k / N (float32 [b, S], the labels'
    shape), N the labelled tokens (label != -1) of the update's k micro-batches.

    For a loss summing the labelled tokens' cross-entropy times the weight
    (`compile_args(model, token_weighted=True)`), a micro-batch's loss is k x its tokens'
    share of the update's token sum, so the mean of the k losses, and of their gradients
    (Keras' accumulation), is the update's token mean: the loss of one batch of k x b
    (transformers' `num_items_in_batch`, 4.46). An update without labelled tokens weighs 0.

    `ds` yields full micro-batches (drop_remainder) with one output's labels in `y`, its
    first micro-batch an update's first: updates are its micro-batches k by k.
    """
    (name, _), = ds.element_spec[1].items()

    def weigh(x, y):  # k micro-batches: labels [k, b, S]
        labelled = tf.reduce_sum(tf.cast(tf.not_equal(y[name], IGNORE_LABEL), tf.float32))
        weight = accumulation / tf.maximum(labelled, 1.0)
        return x, y, {name: tf.fill(tf.shape(y[name]), weight)}  # [k, b, S]

    return ds.batch(accumulation, drop_remainder=True).map(weigh).unbatch()


class StepLogger(keras.callbacks.Callback):
    """Logs the mean loss of each interval of `every` steps, learning rate and speed.

    Keras reports the running mean since the first batch of the epoch; the mean of the last
    interval is what shows whether training still improves. Steps are optimizer updates,
    each of `accumulation` batches (Keras calls `on_train_batch_end` per batch, a
    micro-batch under gradient accumulation); an interval's loss is the mean over its
    batches, which for equal micro-batches is the mean of its updates' losses. Steps count
    across epochs (a run backed up every N steps trains in epochs of N steps) from
    `initial_step` (the step a resumed run starts at). `since_log()` is what a backup keeps
    so that a resumed run's interval spanning the backup averages the same steps as the
    uninterrupted run's.
    """

    def __init__(self, total_steps: int, every: int = 50, initial_step: int = 0,
                 since_log: dict | None = None, accumulation: int = 1):
        """since_log: a backup's `since_log()` at `initial_step` ({"step", "sum"}), or None.
        accumulation: batches per update."""
        super().__init__()
        self.total_steps, self.every = total_steps, max(1, every)
        self.accumulation = accumulation
        self.initial_step = initial_step
        self.history: list[dict] = []
        self._resumed = since_log or {"step": initial_step, "sum": 0.0}

    def on_train_begin(self, logs=None):
        self._start = time.time()
        self._step = self.initial_step
        self._logged_step = self._resumed["step"]
        # Sum of the batch losses since the last logged step in earlier epochs, and the
        # sums (running mean x batches) in this epoch at its last batch and at the last log.
        self._carried = float(self._resumed["sum"])
        self._epoch_sum = self._epoch_logged = 0.0
        self.first_step_end = self.train_end = None

    def since_log(self) -> dict:
        """{"step": the last logged step, "sum": the batch losses summed since}, at the end
        of an epoch (a backup interval)."""
        return {"step": self._logged_step, "sum": self._carried}

    def on_train_end(self, logs=None):
        self.train_end = time.time()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_sum = self._epoch_logged = 0.0

    def on_epoch_end(self, epoch, logs=None):
        self._carried += self._epoch_sum - self._epoch_logged
        self._epoch_sum = self._epoch_logged = 0.0

    def steady_seconds_per_step(self) -> float | None:
        """Seconds per step after the first (which traces the graph), or None for 1 step."""
        steps = self._step - self.initial_step
        if self.first_step_end is None or self.train_end is None or steps < 2:
            return None
        return (self.train_end - self.first_step_end) / (steps - 1)

    def on_train_batch_end(self, batch, logs=None):
        running = float((logs or {}).get("loss", float("nan")))
        self._epoch_sum = running * (batch + 1)
        if (batch + 1) % self.accumulation:  # an update's earlier micro-batches
            return
        self._step += 1
        step = self._step
        if step == self.initial_step + 1:
            self.first_step_end = time.time()
        if step % self.every and step != self.total_steps:
            return
        interval = ((self._carried + self._epoch_sum - self._epoch_logged)
                    / ((step - self._logged_step) * self.accumulation))
        first = self._logged_step + 1
        self._carried, self._epoch_logged, self._logged_step = 0.0, self._epoch_sum, step
        lr = self.model.optimizer.learning_rate
        lr = float(lr.numpy() if hasattr(lr, "numpy") else lr)
        elapsed = time.time() - self._start
        self.history.append({"step": step, "loss": interval, "learning_rate": lr,
                             "seconds": round(elapsed, 3)})
        logging.info("step %d/%d  loss %.4f (steps %d-%d)  lr %.3g  %.2f s/step", step,
                     self.total_steps, interval, first, step, lr,
                     elapsed / (step - self.initial_step))


def train(model: keras.Model, x: dict, y: dict, batch_size: int, num_train_epochs: float,
          learning_rate: float, warmup_proportion: float, seed: int = 0,
          log_every: int = 50, jit_compile: bool = False, num_train_steps: int | None = None,
          callbacks=(), backup_dir: str | None = None, save_checkpoints_steps: int = 0,
          gather=None, epoch_size: int | None = None, gradient_accumulation_steps: int = 1,
          **optimizer_kwargs: Any) -> dict:
    """Fine-tunes `model` with AdamW + warmup/linear decay (BERT's optimizer), plain fit.

    XLA (`jit_compile`) is 5-20% faster per step here but costs seconds of compilation per
    model (docs/DESIGN.md section 9): worth it for real runs, not for tiny ones. On Keras'
    JAX backend the step is always compiled (`jit_compile` is TensorFlow's switch).

    Args:
      model: a task model (its loss comes from `tasks.compile_args`); under a
        mixed_float16 policy its optimizer scales the loss (Keras' LossScaleOptimizer).
      x, y: input and target arrays.
      batch_size: the batch of one call of the train step (a micro-batch with gradient
        accumulation).
      num_train_steps: optimizer updates; default from `num_train_epochs`.
      epoch_size: the examples one epoch of `num_train_epochs` counts; default the rows of
        `x`. Google's run_squad counts questions though it trains on their windows (a
        context longer than a window gives several rows), so its steps are
        int(questions / (batch_size x k) * num_train_epochs).
      gradient_accumulation_steps: k, the micro-batches of `batch_size` whose mean gradient
        makes one update (Keras' optimizer accumulates them): the update of one batch of
        k * batch_size, for a loss that is a mean over examples as for the tagger's mean
        over labelled tokens (whose micro-batches are weighed by `weigh_labelled_tokens`:
        each logs k x its share of the update's token sum, so that an update's logged
        loss, the mean over its micro-batches, is its token mean). Steps (num_train_steps,
        warmup, save_checkpoints_steps, log_every) count updates, and the epochs count
        batches of k * batch_size.
      callbacks: extra Keras callbacks (e.g. TensorBoard).
      backup_dir, save_checkpoints_steps: with both, training runs in intervals of
        `save_checkpoints_steps` updates (Keras epochs) and backs up weights, optimizer,
        dropout state and step after each but the last (`backup.ExactBackupAndRestore`).
        A backup found there is restored first and training continues from its step on
        the same stream of batches: the model ends as an uninterrupted run's would.
      gather: several processes training together: `Distribution.gather_from_processes`,
        so that all resume from the same backup.
      **optimizer_kwargs: passed to `create_optimizer` (e.g. weight_decay).

    Returns:
      {"num_examples", "num_train_steps", "num_warmup_steps", "train_batch_size" (a
       micro-batch), "gradient_accumulation_steps", "effective_batch_size" (the examples
       of one update), "seconds",
       "examples_per_second" (of the steps this call trained), "steady_examples_per_second"
       (after the first step; absent for a one-step run), "loss_history" (a resumed run's
       with the intervals logged before its backup, and the interval spanning it over all
       of its steps), "resumed_from_step" (only when a
       backup was restored)}.

    Raises:
      backup.TrainingDiverged: the loss is NaN or infinite at a step (training stops
        there; the backups made before it stay).
      backup.BackupError: a backup in `backup_dir` that cannot be read, or is not at an
        interval's end.
    """
    n = num_examples(x)
    if n < 1:
        raise ValueError("no training examples")
    if gradient_accumulation_steps < 1:
        raise ValueError(f"gradient_accumulation_steps must be >= 1. Received: "
                         f"{gradient_accumulation_steps}")
    accumulation = gradient_accumulation_steps
    update_batch = batch_size * accumulation  # the examples of one update
    if n < update_batch:
        # The data repeats before batching, so every batch is full (static shapes) and
        # holds some examples twice; Google's script would train 0 steps.
        logging.warning("%d training examples, fewer than %s=%d: each %s repeats some of "
                        "them", n, "train_batch_size" if accumulation == 1 else
                        "train_batch_size x gradient_accumulation_steps", update_batch,
                        "batch" if accumulation == 1 else "update")
    if num_train_steps is None:
        num_train_steps = max(1, int((epoch_size or n) / update_batch * num_train_epochs))
    num_warmup_steps = int(num_train_steps * warmup_proportion)
    optimizer = create_optimizer(learning_rate, num_train_steps, num_warmup_steps,
                                 gradient_accumulation_steps=accumulation,
                                 **optimizer_kwargs)
    encoder = getattr(model, "encoder", None)
    if encoder is not None and encoder.layers_dtype_policy.name == "mixed_float16":
        # float16 gradients need loss scaling. Keras adds it only for a model whose own
        # policy is mixed_float16 (the global one's), not for layers built with `dtype=`
        # (`tasks.with_dtype_policy`): the wrapper it would add, under its name.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, name="loss_scale_optimizer")
    # A loss that is a mean over labelled tokens (the tagger's) is accumulated as the mean
    # over the update's tokens (`weigh_labelled_tokens`); with k = 1 it runs as it always
    # has, a batch's token mean with no weights.
    token_weighted = accumulation > 1 and averages_over_tokens(model)
    model.compile(optimizer=optimizer, jit_compile=jit_compile,
                  **compile_args(model, token_weighted=token_weighted))
    backends.compile_steps_on_jax(model)
    interval, done, backup_callbacks = num_train_steps, 0, []
    if backup_dir and save_checkpoints_steps:
        interval = save_checkpoints_steps
        # The loss history so far goes into each backup: a resumed run's train_results.json
        # had only the intervals trained after the restored step.
        # The logger runs before the backup at an interval's end, so its sum since the last
        # log is the interval's whole.
        backup = ExactBackupAndRestore(backup_dir, delete_checkpoint=False, gather=gather,
                                       final_step=num_train_steps,
                                       notes=lambda: {"loss_history": logger.history,
                                                      "loss_since_log": logger.since_log()})
        # Restored now (fit would do it too, later) to know where the data resumes.
        backup.set_model(model)
        backup.on_train_begin()
        done = updates_done(model)
        if backup.restored_from:
            _log_resumption(backup, done, num_train_steps)
        if done % interval and done != num_train_steps or done > num_train_steps:
            raise BackupError(f"the backup in {backup_dir} is at step {done}, not at the end "
                              f"of an interval of {interval} of this run's {num_train_steps} "
                              f"steps; remove {backup_dir} to train from step 0")
        backup_callbacks = [backup, StopAtStep(num_train_steps)]
    # The batches of the uninterrupted run from step `done` on (the stream is a pure
    # function of the seed): k micro-batches an update.
    if done:
        logging.info("Skipping the %d batches of steps 1-%d in the input (about 1 ms each)",
                     done * accumulation, done)
    ds = make_dataset(x, y, batch_size, shuffle=True, seed=seed, repeat=True,
                      drop_remainder=True)
    if token_weighted:
        ds = weigh_labelled_tokens(ds, accumulation)
    ds = ds.skip(done * accumulation).take((num_train_steps - done) * accumulation)
    notes = (backup.restored_notes if backup_callbacks else None) or {}
    since_log = notes.get("loss_since_log")
    if since_log is not None and not since_log["step"] <= done:
        since_log = None  # not this run's (a backup written before the notes had it)
    logger = StepLogger(num_train_steps, log_every, initial_step=done, since_log=since_log,
                        accumulation=accumulation)
    logger.history = [h for h in notes.get("loss_history", []) if h["step"] <= done]
    logging.info("Training: %d examples%s, batch %s, %d steps (%d warmup), peak lr %g%s", n,
                 f" ({epoch_size} an epoch counts)" if epoch_size and epoch_size != n else "",
                 batch_size if accumulation == 1 else
                 f"{update_batch} ({accumulation} micro-batches of {batch_size} an update)",
                 num_train_steps, num_warmup_steps, learning_rate,
                 f", a backup every {interval} steps in {backup_dir}" if backup_callbacks
                 and interval < num_train_steps else "")
    start = time.time()
    if done < num_train_steps:
        # steps_per_epoch: the count is lost when Keras shards the batches among JAX
        # processes. Epochs are backup intervals (of `interval` updates, each of
        # `accumulation` batches, so a backup falls at an update's end, the accumulated
        # gradients zero); StopAtStep cuts the last one short.
        model.fit(ds, epochs=-(-num_train_steps // interval), initial_epoch=done // interval,
                  steps_per_epoch=interval * accumulation, verbose=0,
                  shuffle=False,  # tf.data shuffles
                  callbacks=[StopOnNonFiniteLoss(learning_rate), logger, *callbacks,
                             *backup_callbacks])
    seconds = time.time() - start
    trained = num_train_steps - done
    summary = {"num_examples": n, "num_train_steps": num_train_steps,
               "num_warmup_steps": num_warmup_steps, "train_batch_size": batch_size,
               "gradient_accumulation_steps": accumulation,
               "effective_batch_size": update_batch, "seconds": round(seconds, 1),
               "examples_per_second": round(trained * update_batch / max(seconds, 1e-9), 2)}
    steady = logger.steady_seconds_per_step()
    if steady is not None:  # without the first step's tracing (and XLA compilation)
        summary["steady_examples_per_second"] = round(update_batch / max(steady, 1e-9), 2)
    summary["loss_history"] = logger.history
    if done:
        summary["resumed_from_step"] = done
    return summary


def _log_resumption(backup: ExactBackupAndRestore, done: int, num_train_steps: int) -> None:
    logging.info("Resuming from %s at step %d of %d", backup.restored_from, done,
                 num_train_steps)
    # A backup of another backend is said by the runner, with any other setting changed
    # since (`runner._backup_dir`), once.
    if not backup.exact and not backup.written_on:
        logging.warning("%s holds no dropout random state: training continues from its "
                        "weights and data position, not bit-identically",
                        backup.restored_from)


def predict(model: keras.Model, x: dict, batch_size: int,
            pad_last_batch: bool | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """Runs the model in inference mode over arrays.

    Args:
      pad_last_batch: whether a last batch shorter than `batch_size` is padded to it;
        None: where there are several batches (one short batch alone runs as it is). A
        caller running one input in parts passes True, so every row is computed in a batch
        of the same shape (the same arithmetic) whatever the part.

    Returns:
      (outputs as numpy, {"seconds", "examples_per_second"}).
    """
    n = num_examples(x)
    pad = n > batch_size if pad_last_batch is None else pad_last_batch
    backends.compile_steps_on_jax(model)
    outputs: dict[str, list] = {}
    start = time.time()
    for begin in range(0, n, batch_size):
        batch = {k: v[begin:begin + batch_size] for k, v in x.items()}
        rows = len(next(iter(batch.values())))
        if rows < batch_size and pad:
            # The last, shorter batch is padded with all-zero rows (outputs dropped below):
            # a new shape would trace the predict function a second time (seconds, and
            # memory for a second graph).
            batch = {k: np.concatenate([v, np.zeros((batch_size - rows, *v.shape[1:]), v.dtype)])
                     for k, v in batch.items()}
        for key, value in model.predict_on_batch(batch).items():
            outputs.setdefault(key, []).append(np.asarray(value)[:rows])
    seconds = time.time() - start
    timing = {"seconds": round(seconds, 3),
              "examples_per_second": round(n / max(seconds, 1e-9), 2)}
    return {k: np.concatenate(v) for k, v in outputs.items()}, timing
