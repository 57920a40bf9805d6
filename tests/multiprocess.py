"""Runs the processes of one distributed job on this machine (loopback), for tests.

TensorFlow's MultiWorkerMirroredStrategy (a TF_CONFIG per worker) and JAX's processes
joined by `keras.distribution.initialize` (--coordinator_address, --num_processes,
--process_id) both need every process started before any of them can go on; `run_job`
starts them, waits a bounded time and kills whatever is left, so a hang fails the test
instead of stalling the suite.
"""

import socket
import subprocess
import tempfile
import time

# Keras reads these when no flag gives the value (bert_keras.distribute.PROCESS_ENVIRONMENT);
# a test's processes must not pick up the environment of whoever runs the suite.
KERAS_PROCESS_VARIABLES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                           "KERAS_DISTRIBUTION_PROCESS_ID")


def free_ports(count):
    """`count` TCP ports free on 127.0.0.1 now (the OS's choice)."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def jax_process_flags(num_processes, port=None):
    """The flags of each of `num_processes` JAX processes joined on 127.0.0.1."""
    port = port or free_ports(1)[0]
    return [[f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={num_processes}",
             f"--process_id={index}"] for index in range(num_processes)]


def run_job(commands, envs, cwd, timeout, signal_when=None):
    """Starts one process per command (with its environment), waits for all of them.

    Args:
      commands: a list of argv lists, one per process.
      envs: a list of environments, one per process.
      cwd: the working directory of every process.
      timeout: seconds for the whole job; processes still running then are killed.
      signal_when: None, or (ready, index, signum): once `ready()` is true, process `index`
        gets signal `signum` (a scheduler's SIGTERM); an AssertionError if every process
        ended first.

    Returns:
      (exit codes, outputs): each process's code (None if it had to be killed) and its
      stdout and stderr together.
    """
    processes, logs = [], []
    try:
        for command, env in zip(commands, envs):
            env = {k: v for k, v in env.items() if k not in KERAS_PROCESS_VARIABLES}
            log = tempfile.TemporaryFile("w+")
            logs.append(log)
            processes.append(subprocess.Popen(command, cwd=cwd, env=env, stdout=log,
                                              stderr=subprocess.STDOUT, text=True))
        deadline = time.monotonic() + timeout
        if signal_when is not None:
            ready, index, signum = signal_when
            while not ready() and time.monotonic() < deadline:
                assert any(p.poll() is None for p in processes), "the job ended first"
                time.sleep(0.05)
            processes[index].send_signal(signum)
        codes = []
        for process in processes:
            try:
                codes.append(process.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        for process in processes:  # Processes end themselves; this only guards a hang.
            if process.poll() is None:
                process.kill()
                process.wait(30)
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    return codes, outputs


PREEMPTED = ("error: stopped on a preemption notice (SIGTERM to a process of this job): every "
             "process stopped after training call ")


def assert_preempted(codes, outputs, then):
    """Every process of a job stopped on a SIGTERM (distribute.StopOnPreemption) at one
    training call: exit status 1 and the same last line, ending with `then`."""
    assert codes == [1] * len(codes), describe(codes, outputs)
    last = [output.strip().splitlines()[-1] for output in outputs]
    assert len(set(last)) == 1, last
    assert last[0].startswith(PREEMPTED) and last[0].endswith(f" of this run; {then}"), last


def describe(codes, outputs, tail=3000):
    """The exit codes and each process's last output, for an assertion message."""
    return f"exit codes {codes}\n" + "\n".join(
        f"--- process {i} ---\n{out[-tail:]}" for i, out in enumerate(outputs))


def kill_between_backups(commands, envs, cwd, backups, epoch=2, timeout=600):
    """Starts a job, kills every process with SIGKILL once all their backups reached `epoch`,
    and leaves the last process one backup behind the first, as a kill landing between the
    processes' backup writes does (a preempted job).

    Args:
      commands, envs, cwd: as `run_job`'s.
      backups: each process's backup directory (bert_keras.backup), in process order.
      epoch: the epoch every backup reaches before the kill.
      timeout: seconds to reach it.

    Returns:
      The index of the process left ahead (0, or the one the kill itself left ahead when
      it landed between two backups).
    """
    import json
    import os

    from bert_keras.backup import backup_epoch

    def written():
        try:
            return [json.loads(open(os.path.join(b, "training_metadata.json")).read())["epoch"]
                    for b in backups]
        except (OSError, ValueError, KeyError):
            return []

    processes = []
    reached, deadline = False, time.monotonic() + timeout
    try:
        for command, env in zip(commands, envs):
            env = {k: v for k, v in env.items() if k not in KERAS_PROCESS_VARIABLES}
            processes.append(subprocess.Popen(command, cwd=cwd, env=env,
                                              stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))
        while not reached and time.monotonic() < deadline and all(
                p.poll() is None for p in processes):
            epochs = written()
            reached = bool(epochs) and min(epochs) >= epoch and len(set(epochs)) == 1
            time.sleep(0.05)
    finally:
        for process in processes:
            process.kill()
            process.wait(30)
    assert reached, "the job ended (or stalled) before its backups reached epoch " + str(epoch)
    latest = [backup_epoch(os.path.join(b, "latest.weights.h5")) for b in backups]
    if len(set(latest)) == 1:
        os.remove(os.path.join(backups[-1], "latest.weights.h5"))  # One epoch behind.
        return 0
    assert max(latest) - min(latest) == 1, latest  # The kill landed between two backups.
    return latest.index(max(latest))
