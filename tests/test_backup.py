"""ExactBackupAndRestore: a run interrupted anywhere resumes to bit-identical weights.

A small Keras model with dropout (whose random state Keras' own BackupAndRestore loses) is
trained for 4 epochs without interruption, and again with a crash at each point where a
kill can land: inside an epoch, while the backup file is being written, after the previous
backup was renamed aside and before the new one exists, and with a torn backup file on
disk. Every resumed run must end with exactly the uninterrupted run's weights.
"""

import json
import os

import h5py
import keras
import numpy as np
import pytest

from bert_keras import checkpoints
from bert_keras.backup import (RESUME_GROUP, BackupError, ExactBackupAndRestore,
                               random_state_variables)
from bert_keras.layers.dropout import Dropout

EPOCHS, BATCH = 4, 8
RNG = np.random.default_rng(0)
X = RNG.normal(size=(48, 6)).astype("float32")
Y = RNG.normal(size=(48, 1)).astype("float32")


def _model():
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                              Dropout(0.3), keras.layers.Dense(16, activation="relu"),
                              Dropout(0.3), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def _fit(model, backup_dir, callbacks=()):
    backup = ExactBackupAndRestore(str(backup_dir), delete_checkpoint=False)
    model.fit(X, Y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[backup, *callbacks])
    return backup


class _Crash(Exception):
    pass


class _CrashAtBatch(keras.callbacks.Callback):
    def __init__(self, epoch, batch):
        super().__init__()
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise _Crash()


class _CrashWhileWritingBackup(keras.callbacks.Callback):
    """In epoch `epoch`, the backup's weights writer (checkpoints.save_weights) writes half a
    file and dies."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch
        self.real = checkpoints.save_weights

    def on_epoch_begin(self, epoch, logs=None):
        if epoch != self.epoch:
            return

        def torn_save(model, filepath):
            checkpoints.save_weights = self.real  # once
            self.real(model, filepath)
            size = os.path.getsize(filepath)
            with open(filepath, "r+b") as f:
                f.truncate(size // 2)
            raise _Crash()

        checkpoints.save_weights = torn_save

    def on_train_end(self, logs=None):
        checkpoints.save_weights = self.real


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    model = _model()
    _fit(model, tmp_path_factory.mktemp("reference") / "backup")
    return model.get_weights()


def _assert_same(model, reference):
    for got, want in zip(model.get_weights(), reference, strict=True):
        np.testing.assert_array_equal(got, want)


def _crash(backup_dir, crasher):
    with pytest.raises(_Crash):
        _fit(_model(), backup_dir, [crasher])


def test_random_state_is_what_save_weights_leaves_out():
    model = _model()
    states = random_state_variables(model)
    assert len(states) == 2 and all("seed_generator_state" in v.path for v in states)


def test_kill_inside_an_epoch_resumes_bit_identically(reference, tmp_path):
    _crash(tmp_path, _CrashAtBatch(epoch=2, batch=3))
    model = _model()
    backup = _fit(model, tmp_path)
    assert backup.restored_step == 2 * len(X) // BATCH and backup.exact
    _assert_same(model, reference)
    with h5py.File(tmp_path / "latest.weights.h5") as f:
        assert f[RESUME_GROUP].attrs["epoch"] == EPOCHS
        assert f[RESUME_GROUP]["random_state"].shape == (2, 2)
    assert json.loads((tmp_path / "training_metadata.json").read_text())["epoch"] == EPOCHS


def test_kill_while_writing_the_backup_resumes_from_the_previous_one(reference, tmp_path):
    _crash(tmp_path, _CrashWhileWritingBackup(epoch=2))
    # The torn file never got the final name; the epoch-1 backup was renamed aside.
    assert not (tmp_path / "latest.weights.h5").exists()
    assert [n for n in os.listdir(tmp_path) if n.startswith(".incomplete")] == []
    model = _model()
    backup = _fit(model, tmp_path)
    assert backup.restored_from.endswith("previous.weights.h5") and backup.restored_step == 12
    _assert_same(model, reference)


def test_torn_latest_file_falls_back_to_the_previous_backup(reference, tmp_path):
    _crash(tmp_path, _CrashAtBatch(epoch=3, batch=0))
    latest = tmp_path / "latest.weights.h5"
    size = latest.stat().st_size
    with open(latest, "r+b") as f:  # A disk or copy that tore the file.
        f.truncate(int(size * 0.6))
    (tmp_path / "training_metadata.json").write_text("")  # Keras' kill-while-writing leftover.
    model = _model()
    backup = _fit(model, tmp_path)
    assert backup.restored_from.endswith("previous.weights.h5") and backup.restored_step == 12
    _assert_same(model, reference)


def test_unreadable_backups_are_one_clear_error(tmp_path):
    for name in ("latest.weights.h5", "previous.weights.h5"):
        (tmp_path / name).write_bytes(b"not hdf5")
    with pytest.raises(BackupError) as e:
        _fit(_model(), tmp_path)
    message = str(e.value)
    assert "\n" not in message and "previous.weights.h5" in message
    assert f"remove {tmp_path} to start the run over" in message


def test_a_backup_of_other_trainable_weights_is_refused_not_resumed_from_step_0(tmp_path):
    """Keras skips an optimizer state of another variable count with a warning: the run
    went on from the backup's weights with fresh moments and its step counter at 0 (a
    backup from before a change of what trains, e.g. the MLM-only pretrainer's pooler)."""
    _crash(tmp_path, _CrashAtBatch(epoch=2, batch=3))
    model = _model()
    model.layers[0].trainable = False  # 2 fewer trainable variables: 4 fewer Adam slots
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    with pytest.raises(BackupError) as e:
        _fit(model, tmp_path)
    message = str(e.value)
    assert "\n" not in message
    # Adam: iterations and learning rate, and 2 slots per trainable variable (6, then 4).
    assert message.count("its optimizer state has 14 variables, this model's optimizer 10: "
                         "it was written for other trainable weights") == 2  # both backups


def test_a_backup_from_keras_own_callback_resumes_but_not_exactly(tmp_path):
    model = _model()
    model.fit(X, Y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path), delete_checkpoint=False)])
    resumed = _model()
    backup = _fit(resumed, tmp_path)
    assert backup.restored_step == len(X) // BATCH and not backup.exact


def test_a_backup_from_another_backend_resumes_but_says_it_is_not_exact(tmp_path):
    """Keras' backends draw other numbers from one seed state: a backup written on another
    backend restores the same state, but the dropout masks that follow differ."""
    written = _fit(_model(), tmp_path)
    assert written.written_on is None
    with h5py.File(tmp_path / "latest.weights.h5", "r+") as f:
        assert f[RESUME_GROUP].attrs["backend"] == keras.backend.backend()
        f[RESUME_GROUP].attrs["backend"] = "other"
    backup = ExactBackupAndRestore(str(tmp_path), delete_checkpoint=False)
    backup.set_model(_model())
    backup.on_train_begin()
    assert backup.written_on == "other" and not backup.exact
    assert backup.restored_step == EPOCHS * len(X) // BATCH


def test_only_epoch_backups():
    with pytest.raises(ValueError, match="save_freq"):
        ExactBackupAndRestore("x", save_freq=10)


# --- Several processes, each with its own backup (JAX's multi-process DataParallel) ----

def _fit_as_one_of_two(model, backup_dir, other):
    """_fit as process 0 of two whose process 1 holds backups of epochs `other` (newest
    first); returns the callback and the rows process 0 handed the exchange."""
    sent = []

    def gather(row):
        sent.append(list(row))
        return [list(row), (list(other) + [-1, -1])[:2]]

    backup = ExactBackupAndRestore(str(backup_dir), delete_checkpoint=False, gather=gather)
    model.fit(X, Y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[backup])
    return backup, sent


def test_processes_resume_from_the_newest_epoch_all_of_them_hold(reference, tmp_path, caplog):
    """A kill after this process wrote its backup of epoch 3 and before the other did: the
    other holds epochs 2 and 1, so this one resumes from its previous backup (epoch 2), as
    the other does, and still ends with the uninterrupted run's weights."""
    _crash(tmp_path, _CrashAtBatch(epoch=3, batch=0))
    model = _model()
    with caplog.at_level("WARNING"):
        backup, sent = _fit_as_one_of_two(model, tmp_path, other=[2, 1])
    assert sent == [[3, 2]]
    assert backup.restored_from.endswith("previous.weights.h5") and backup.restored_step == 12
    assert "the newest that every process holds (this process's newest: epoch 3)" in caplog.text
    _assert_same(model, reference)
    # Both at epoch 3: the latest, as one process would.
    _crash(tmp_path / "b", _CrashAtBatch(epoch=3, batch=0))
    backup, _ = _fit_as_one_of_two(_model(), tmp_path / "b", other=[3, 2])
    assert backup.restored_from.endswith("latest.weights.h5") and backup.restored_step == 18


def test_processes_with_no_backup_in_common_stop_with_one_clear_error(tmp_path):
    _crash(tmp_path, _CrashAtBatch(epoch=3, batch=0))  # Epochs 3 and 2 here.
    with pytest.raises(BackupError) as e:
        _fit_as_one_of_two(_model(), tmp_path, other=[1])
    message = str(e.value)
    assert "\n" not in message
    assert "process 0: [3, 2]; process 1: [1]" in message
    assert "remove every process's backup" in message and str(tmp_path) in message
    # No process has any backup: all start at step 0.
    backup, sent = _fit_as_one_of_two(_model(), tmp_path / "fresh", other=[])
    assert sent == [[-1, -1]] and backup.restored_from is None and backup.restored_step == 0
