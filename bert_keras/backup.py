"""Crash-safe training backups that resume bit for bit: Keras' BackupAndRestore, completed.

Keras' `BackupAndRestore` saves `model.save_weights` (weights and optimizer variables) and
an epoch counter. Two things a resumed run needs are missing or unsafe there:

- **Random state.** `save_weights` stores `model.weights`, which leaves out every
  `SeedGenerator` state (each Dropout layer's counter). A resumed run restarted the dropout
  masks from their initial seeds, so its weights drifted from the uninterrupted run's
  (1e-2 after 60 steps of a tiny model). Here every model variable that `save_weights` does
  not store (`model.variables` minus `model.weights`: the seed generator states) is saved in
  the same file and restored with it.
- **Atomicity.** Keras writes `latest.weights.h5` in place and the epoch counter in a second
  file, so a kill while writing leaves a truncated file (loaded as garbage or refused) or a
  counter that disagrees with the weights, and a kill while writing the JSON counter left a
  file that failed every later restart. Here one file holds weights, optimizer, random state,
  epoch and step; it is written under a temporary name and renamed
  (`data_prep.files.atomic_output`), and the previous backup is kept as
  `previous.weights.h5` (by a rename, before the new one is written). A restart loads the
  newest file that reads completely, so a kill at any moment leaves a loadable backup.

`training_metadata.json` is still written (after the weights, atomically) for people and
tools that look at it; restoring reads the epoch from the weights file.

Resumption is exact when the rest of the run is a deterministic function of this state: the
input pipeline must resume at the same position (run_pretraining recomputes it from the
restored step) and ops must be deterministic (`--deterministic`).
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings

import h5py
import keras
import numpy as np
from absl import logging

from data_prep import files

# HDF5 group added to Keras' weights file: attributes epoch, step, format, backend (Keras'
# backend that wrote it; absent in older files); dataset random_state [n, 2] int64 (one row
# per seed generator, in `model.variables` order).
RESUME_GROUP = "bert_keras_resume"
RESUME_FORMAT = "bert-keras-resume/1"
# The backup before the latest one (Keras' double_checkpoint).
PREVIOUS_WEIGHTS_FILE = "previous.weights.h5"
LATEST_WEIGHTS_FILE = "latest.weights.h5"  # Keras' name for the newest backup
# Under a trainer's --output_dir: the chief's backups in backup/, each other process's in
# workers/<name>/backup/ (two processes writing one file would corrupt it).
BACKUP_DIR = "backup"
WORKERS_DIR = "workers"


class BackupError(ValueError):
    """No backup in a backup directory can be read; the message names the files."""


def random_state_variables(model: keras.Model) -> list:
    """The model's variables that `save_weights` leaves out, in a stable order.

    These are the `SeedGenerator` states of its random layers (Dropout): Keras lists them in
    `model.variables` but not in `model.weights`.
    """
    stored = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in stored]


def backup_epoch(path: str) -> int:
    """The epoch a backup file was written at (the number of epochs it completed).

    Raises:
      OSError: not an HDF5 file (missing, torn); KeyError: no epoch in it (a backup of
        Keras' own callback, whose epoch lives in training_metadata.json).
    """
    with h5py.File(path, "r") as f:
        group = f.get(RESUME_GROUP)
        if group is None or "epoch" not in group.attrs:
            raise KeyError("written without an epoch (by Keras' own BackupAndRestore)")
        return int(group.attrs["epoch"])


# Keras' warning (optimizers/base_optimizer.py, load_own_variables) for an optimizer state
# of another variable count, which it skips.
_SKIPPED_OPTIMIZER = re.compile(r"Skipping variable loading for optimizer .*, because it has "
                                r"(\d+) variables whereas the saved optimizer has (\d+) variables")


class ExactBackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` with random state, atomic writes and a fallback.

    Same arguments and file names as Keras' callback (module docstring for what differs).
    Saves at the end of every epoch (`save_freq="epoch"` only: a backup in the middle of
    an epoch cannot tell the input pipeline where to resume). Restoring happens once, in
    the first `on_train_begin` (a caller may call it before `fit` to learn the step).

    Attributes (after `on_train_begin`):
      restored_from: the file the state was loaded from, or None (fresh start).
      restored_step: optimizer updates done in that state (0 for a fresh start).
      exact: False when the restored file predates random-state backups (it was written by
        Keras' own callback) or was written on another Keras backend (whose random streams
        draw other dropout masks from the same state): training continues, but not
        bit-identically.
      written_on: the Keras backend that wrote the restored file when it is not this
        process's, else None.

    Args (beyond Keras'):
      gather: for several processes training together, `gather(row) -> every process's
        row` (`_agreed`).
      final_step: no backup is written once the optimizer has made this many updates (the
        caller saves the trained model right after, and a base model's backup with its
        optimizer state is 1.3 GB); None: a backup at every epoch end.
      notes: `notes() -> a JSON-able value` kept with every backup (the loss history so
        far); the restored backup's is `restored_notes` (None when it has none).
    """

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=True,
                 delete_checkpoint=True, gather=None, final_step=None, notes=None):
        if save_freq != "epoch":
            raise ValueError(f"ExactBackupAndRestore saves at epoch ends only; "
                             f"received save_freq={save_freq!r}")
        super().__init__(backup_dir, save_freq=save_freq, double_checkpoint=double_checkpoint,
                         delete_checkpoint=delete_checkpoint)
        # Keras names it latest.weights.h5.bkp, which its own load_weights refuses to read
        # (it goes by the extension); a name Keras loads needs no copy before loading.
        self._prev_weights_path = os.path.join(backup_dir, PREVIOUS_WEIGHTS_FILE)
        self.restored_from = None
        self.restored_step = 0
        self.exact = True
        self.written_on = None
        self._restore_done = False
        # Several processes training together (JAX's multi-process DataParallel,
        # TensorFlow's multi-worker strategy), each with its own backup: gather(row) -> every
        # process's row (distribute.Distribution.gather_from_processes), so that all resume
        # from the same epoch.
        self._gather = gather
        self._final_step = final_step
        self._notes = notes
        self.restored_notes = None

    # --- restore ---

    def on_train_begin(self, logs=None):
        if self._restore_done:
            return
        if not self.model.built:
            raise ValueError("ExactBackupAndRestore needs a built model before fit()")
        candidates = [p for p in (self._weights_path, self._prev_weights_path)
                      if files.exists(p)]
        problems = []
        if self._gather is not None:
            candidates, problems = self._agreed(candidates)
        for path in candidates:
            try:
                self._restore(path)
            except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
                reason = " ".join(str(e).split())[:200] or type(e).__name__
                problems.append(f"{path} ({reason})")
                continue
            if problems:
                logging.warning("Backup %s could not be read; resumed from the previous one, %s",
                                "; ".join(problems), path)
            self.restored_from = path
            self._restore_done = True
            return
        if problems:
            raise BackupError(f"no backup in {self.backup_dir} can be read: "
                              f"{'; '.join(problems)}; remove {self.backup_dir} to start the "
                              "run over from step 0")
        self._restore_done = True

    def _agreed(self, candidates):
        """The backup this process restores so that every process resumes at one epoch.

        A kill (a preempted pod slice) can land after one process wrote its backup of epoch
        e and before another did: one then holds e and e - 1, the other e - 1 and e - 2, and
        each restoring its newest would train different steps (the collectives hang or
        fail). Every process reads the epochs its files hold and all take the newest epoch
        every process has.

        Returns:
          ([path] or [], problems): the file to restore ([] when no process has a backup:
          a fresh start everywhere) and the files that could not be read.
        """
        epochs, problems = {}, []
        for path in candidates:
            try:
                epochs[path] = backup_epoch(path)
            except (OSError, ValueError, KeyError) as e:
                reason = " ".join(str(e).split())[:200] or type(e).__name__
                problems.append(f"{path} ({reason})")
        mine = sorted(set(epochs.values()), reverse=True)
        rows = self._gather((mine + [-1, -1])[:2])
        held = [set(row) - {-1} for row in rows]
        if not any(held):
            return [], problems
        common = set.intersection(*held)
        if not common:
            described = "; ".join(f"process {i}: {sorted(h, reverse=True) or 'none'}"
                                  for i, h in enumerate(held))
            raise BackupError(
                f"the processes' backups hold no epoch in common ({described}); this "
                f"process's are in {self.backup_dir}: remove every process's backup to start "
                "the run over from step 0")
        epoch = max(common)
        if mine and epoch != mine[0]:
            logging.warning("Resuming from the backup of epoch %d, the newest that every "
                            "process holds (this process's newest: epoch %d)", epoch, mine[0])
        return [p for p, e in epochs.items() if e == epoch][:1], problems

    def _restore(self, path: str) -> None:
        # h5py reads local files only: a backup on gs:// is read from a local copy.
        with files.local_copy(path) as local:
            self._restore_local(local)

    def _restore_local(self, path: str) -> None:
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        with h5py.File(path, "r") as f:  # OSError for a file that is not HDF5
            group = f.get(RESUME_GROUP)
            meta = dict(group.attrs) if group is not None else None
            random_state = (np.asarray(group["random_state"][()]) if group is not None
                            else None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.model.load_weights(path)
        for warning in caught:
            # Keras skips an optimizer state of another variable count with a warning: the
            # run would go on from the backup's weights with fresh moments and step 0.
            counts = _SKIPPED_OPTIMIZER.match(str(warning.message))
            if counts:
                raise ValueError(f"its optimizer state has {counts[2]} variables, this "
                                 f"model's optimizer {counts[1]}: it was written for other "
                                 "trainable weights")
            warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                   warning.lineno)
        variables = random_state_variables(self.model)
        epoch = None
        if meta is None:
            self.exact = False  # Written by Keras' own callback: no random state.
        else:
            if random_state.shape != (len(variables), 2):
                raise ValueError(f"its random state has shape {random_state.shape}, the model "
                                 f"has {len(variables)} seed generators")
            for variable, value in zip(variables, random_state):
                variable.assign(value.astype(variable.dtype))
            epoch = int(meta["epoch"])
            if "notes" in meta:
                self.restored_notes = json.loads(str(meta["notes"]))
            written_on = meta.get("backend")
            if written_on is not None and str(written_on) != keras.backend.backend():
                # Weights, optimizer and seed states carry over, and the step computes the
                # same function, but each backend's generator draws its own masks.
                self.exact, self.written_on = False, str(written_on)
        self.restored_step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)
                                 ) if self.model.optimizer is not None else 0
        if epoch is not None:
            self.model._initial_epoch = epoch

    # --- save ---

    def _save_model(self):
        step = (int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
                if self.model.optimizer is not None else 0)
        if self._final_step is not None and step >= self._final_step:
            return
        files.makedirs(self.backup_dir)
        variables = random_state_variables(self.model)
        random_state = np.array([keras.ops.convert_to_numpy(v) for v in variables],
                                np.int64).reshape(len(variables), 2)
        if self.double_checkpoint and files.exists(self._weights_path):
            # A rename: from here until the new file is in place, the previous state is the
            # .bkp file, which a restart loads.
            files.replace(self._weights_path, self._prev_weights_path)
        from bert_keras import checkpoints

        with files.atomic_output(self._weights_path, overwrite=True) as tmp:
            # Through checkpoints' writer: a full disk is an error, not HDF5's crash.
            checkpoints.save_weights(self.model, tmp)
            with checkpoints.h5_file_writing(tmp, "a") as f:
                group = f.create_group(RESUME_GROUP)
                group.attrs["format"] = RESUME_FORMAT
                group.attrs["epoch"] = self._current_epoch
                group.attrs["step"] = step
                group.attrs["backend"] = keras.backend.backend()
                if self._notes is not None:
                    group.attrs["notes"] = json.dumps(self._notes())
                group.create_dataset("random_state", data=random_state)
        files.write_json(self._training_metadata_path,
                         {"epoch": self._current_epoch, "batch": 0, "step": step})


class StopAtStep(keras.callbacks.Callback):
    """Ends training once the optimizer has made `num_train_steps` updates, in the middle of
    an epoch when the last backup interval is shorter than the others (Keras still runs
    on_epoch_end, so the last interval gets its evaluation and callbacks). Training in
    intervals of a fixed number of steps, each an epoch, is how a run is backed up at exact
    step boundaries."""

    def __init__(self, num_train_steps: int):
        super().__init__()
        self.num_train_steps = num_train_steps

    def on_train_batch_end(self, batch, logs=None):
        if updates_done(self.model) >= self.num_train_steps:
            self.model.stop_training = True


class IntervalProgbarLogger(keras.callbacks.ProgbarLogger):
    """Keras' progress bar over intervals of `interval` updates (each an epoch of
    `interval * accumulation` batches) whose last one `StopAtStep` cuts short: its bar's
    total is the batches it runs (Keras' shows the epoch's `steps`, "1000/1000" where 4
    steps ran, and divides the time by them). Pass it to fit in place of Keras' own."""

    def __init__(self, num_train_steps: int, interval: int, accumulation: int = 1):
        super().__init__()
        self.num_train_steps, self.interval = num_train_steps, interval
        self.accumulation = accumulation

    def on_epoch_begin(self, epoch, logs=None):
        remaining = self.num_train_steps - epoch * self.interval
        self.target = max(1, min(self.interval, remaining)) * self.accumulation
        super().on_epoch_begin(epoch, logs)


class TrainingDiverged(ValueError):
    """The training loss stopped being a finite number."""


class StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Raises `TrainingDiverged` once the training loss is not finite, before anything of
    that step is saved (put it first among the callbacks).

    Keras' `TerminateOnNaN` only stops the epoch: the run would go on to back up, save,
    evaluate and export a model of NaN weights (and fail writing the NaN loss to JSON).
    Keras' running mean of the epoch's loss stays NaN or inf from the step the loss is on,
    so checking every `check_every` steps (and at each epoch's end) finds it; each check
    reads the loss to the host, so a trainer that keeps the device busy checks seldom.
    """

    def __init__(self, learning_rate: float | None = None, check_every: int = 1):
        """check_every: batch-end calls between checks (a call per step, or per execution
        of several steps)."""
        super().__init__()
        self._learning_rate, self._every, self._calls = learning_rate, max(1, check_every), 0

    def on_train_batch_end(self, batch, logs=None):
        self._calls += 1
        if self._calls % self._every == 0:
            self._check(logs, "at")

    def on_epoch_end(self, epoch, logs=None):
        self._check(logs, "by")

    def _check(self, logs, at_or_by):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            rate = f" (now {self._learning_rate:g})" if self._learning_rate else ""
            raise TrainingDiverged(
                f"training diverged: the loss is {float(loss)} {at_or_by} step "
                f"{updates_done(self.model)}; lower --learning_rate{rate}, or look for labels "
                "or inputs out of range")


def updates_done(model: keras.Model) -> int:
    """Optimizer updates so far (works for mirrored variables, which int() rejects)."""
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def process_backup_dir(output_dir: str, distribution) -> str:
    """Where this process of a trainer writing to `output_dir` keeps its backups
    (`distribution`: a `distribute.Distribution`)."""
    if distribution.is_chief:
        return os.path.join(output_dir, BACKUP_DIR)
    return os.path.join(output_dir, WORKERS_DIR, distribution.worker_name, BACKUP_DIR)


def holds_a_backup(backup_dir: str) -> bool:
    """Whether `backup_dir` has a backup file to resume from."""
    return any(files.exists(os.path.join(backup_dir, name))
               for name in (LATEST_WEIGHTS_FILE, PREVIOUS_WEIGHTS_FILE))


def remove_backups(output_dir: str, distribution) -> None:
    """Removes this process's backups once the trained model is saved. The chief removes
    workers/ whole: a job resumed on fewer processes leaves the backups of those that did
    not come back there. Another process removes its own directory, and workers/ once the
    last one is gone."""
    backup_dir = process_backup_dir(output_dir, distribution)
    files.rmtree(backup_dir)
    if distribution.is_chief:
        files.rmtree(os.path.join(output_dir, WORKERS_DIR))
        return
    worker_dir = os.path.dirname(backup_dir)
    for directory in (worker_dir, os.path.dirname(worker_dir)):
        try:
            files.rmdir(directory)  # on gs:// too, where os.rmdir removed nothing
        except OSError:
            pass  # another worker's backups are still in it
