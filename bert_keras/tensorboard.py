"""TensorBoard logs that keep every point: Keras' callback, minus what loses them.

Keras 3.15's `keras.callbacks.TensorBoard(update_freq=N)` records under a
`tf.summary.record_if(step % N == 0)` that stays in force after the last batch: the
epoch scalars and the evaluation points are written only when the epoch's last batch
(or the evaluation's) happens to be a multiple of N. A run of 600 steps in intervals of
120 with N=100 kept the epoch scalars and the validation point of step 600 only. Its batch
step also restarts at 0 when `fit` resumes (BackupAndRestore, `initial_epoch`).

`TensorBoard` here lets Keras write the epoch scalars (train/ and validation/, learning
rate included), always, and writes the batch scalars itself, every `log_steps` batches, at
the global step: `epoch * steps_per_epoch + batch`, which a resumed run continues. It also
writes the evaluation points (`evaluation_*_vs_iterations`) itself, from the epoch's `val_`
logs: Keras writes them when fit's own validation ends (`on_test_end`), which an evaluation
run beside fit (run_pretraining's, of a model compiled apart) never calls.

A run killed between two backups has written the batch scalars of steps its resumption
trains again. Every `fit` therefore starts its train/ events with a `SessionLog.START` at
its first step, as Estimator's CheckpointSaverHook did for Google's run_pretraining:
TensorBoard (`--purge_orphaned_data`, on by default) takes a START after the first as a
restart and drops the points of earlier files at that step or later, so the curve shows
each step once, from the run that went on.
"""

from __future__ import annotations

import time

import keras
import tensorflow as tf

from bert_keras.backup import updates_done


class TensorBoard(keras.callbacks.TensorBoard):
    """`keras.callbacks.TensorBoard` writing train scalars every `log_steps` batches.

    Event files, under `log_dir`:
      train/       batch_<metric> and batch_learning_rate at every log_steps-th batch
                   (x axis: batches since the start of training, resumptions included);
                   epoch_<metric>, epoch_learning_rate at every epoch (x axis: epoch)
      validation/  epoch_<metric> at every epoch whose logs hold val_<metric> (x axis:
                   epoch); evaluation_<metric>_vs_iterations at the same epochs (x axis:
                   optimizer updates)
    """

    def __init__(self, log_dir: str, log_steps: int = 100, accumulation: int = 1, **kwargs):
        """Args:
          log_dir: the directory of the event files.
          log_steps: steps between two points of the batch scalars; >= 1.
          accumulation: batches (calls of the train step) per step of the x axis: 1, each
            batch (micro-batches with gradient accumulation: run_pretraining's axis), or
            the micro-batches of one optimizer update (the fine-tuning tools' axis, whose
            --log_steps counts updates); points then fall on update ends only.
          **kwargs: other arguments of keras.callbacks.TensorBoard (not update_freq).
        """
        if log_steps < 1:
            raise ValueError(f"log_steps must be at least 1. Received: log_steps={log_steps}")
        if accumulation < 1:
            raise ValueError(f"accumulation must be at least 1. Received: {accumulation}")
        # update_freq="epoch": Keras pushes no record_if condition (the cause above).
        super().__init__(log_dir=log_dir, update_freq="epoch", **kwargs)
        self.log_steps = log_steps
        self.accumulation = accumulation
        self._epoch = 0
        self._last_step = 0

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self._last_step = None  # set by the first batch (a resumed run starts mid-axis)

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        if self._last_step is None:  # this fit's first epoch: where its steps start
            steps_per_epoch = (self.params or {}).get("steps") or 0
            self._start_session(epoch * steps_per_epoch // self.accumulation + 1)
        self._epoch = epoch

    def _start_session(self, step: int) -> None:
        """Writes SessionLog.START at `step` first in the train/ events of this fit."""
        from tensorflow.core.util import event_pb2

        event = event_pb2.Event(wall_time=time.time(), step=step,
                                session_log=event_pb2.SessionLog(
                                    status=event_pb2.SessionLog.START))
        # ImportEvent writes a whole Event into the writer's own file (tf.summary has no
        # public call for a SessionLog); a second file would sort apart from it.
        tf.raw_ops.ImportEvent(writer=self._train_writer._resource,
                               event=event.SerializeToString())
        self._train_writer.flush()

    def on_test_end(self, logs=None):
        self._pop_writer()  # Keras' pushed in on_test_begin; the points come at the epoch's end

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        evaluated = {k[len("val_"):]: v for k, v in (logs or {}).items() if k.startswith("val_")}
        if evaluated and getattr(self.model, "optimizer", None) is not None:
            step = updates_done(self.model)
            with self._val_writer.as_default(step=step):
                for name, value in evaluated.items():
                    tf.summary.scalar(f"evaluation_{name}_vs_iterations", value)

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)  # graph, profiling; its scalars go nowhere
        steps_per_epoch = (self.params or {}).get("steps") or 0
        # `batch` is the index of the last step of the call (steps_per_execution > 1
        # runs several per call).
        batches = self._epoch * steps_per_epoch + batch + 1
        if batches % self.accumulation:  # within an update
            return
        step = batches // self.accumulation
        previous = self._last_step if self._last_step is not None else step - 1
        self._last_step = step
        if step // self.log_steps == previous // self.log_steps or not isinstance(logs, dict):
            return
        values = dict(logs)
        values = self._collect_learning_rate(values)
        with self._train_writer.as_default(step=step):
            for name, value in values.items():
                tf.summary.scalar(f"batch_{name}", value)
