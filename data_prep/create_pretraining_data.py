r"""Writes BERT pretraining TFRecords (masked LM + next sentence) from plain text.

Input is Google's format: one sentence per line, a blank line between documents (the end of
a file also ends a document). `python -m data_prep.prepare_corpus` makes it from raw text.
Output is Google's schema (data_prep/features.py), so Google's, Model Garden's and our
trainers read it, plus one JSON sidecar per shard (`<shard>.meta.json`).

Unlike Google's tool this one streams: memory does not grow with the corpus (see
data_prep/pretraining_instances.py for the bounded NotNext pool and the shuffle buffer), and
`--num_workers` processes share the work. Output bytes depend only on the flags (seed and
number of workers included), never on timing.

Example:

  python -m data_prep.create_pretraining_data \
    --input_file='corpus/*.txt' --vocab_file=vocab.txt \
    --output_file=out/pretrain --num_output_shards=4 --num_workers=2 \
    --max_seq_length=128 --max_predictions_per_seq=20 --dupe_factor=10

With --dynamic_masking the instances are written without masks (input_ids, input_mask,
segment_ids, next_sentence_labels; --dupe_factor then defaults to 1) and the trainer masks
them anew on every pass, at its own --masked_lm_prob (RoBERTa's dynamic masking); the
sidecars record `"masking": "dynamic"`.

Shards are written as `.incomplete-<pid>.<name>` and renamed when the whole run has succeeded;
existing outputs are never replaced unless --overwrite is given.
"""

from __future__ import annotations

import dataclasses
import errno
import multiprocessing
import os
import queue
import random
import textwrap
import time
import traceback
from typing import Callable, Iterator, Sequence

from absl import app
from absl import flags
from absl import logging
import numpy as np

from data_prep import features
from data_prep import files
from data_prep import pretraining_instances as pi
from data_prep import schema
from data_prep import tokenizer_config
# The job, the reader, tokenization and the checks are shared with beam_pipeline.py.
from data_prep.pretraining_job import (  # noqa: F401 (re-exported: the tool's names)
    LONG_LINE_WARN_BYTES, MAX_LINE_BYTES, CorpusError, InputError, JobSpec, RawDocument,
    WorkerResult, check_totals, describe_shard_sets, limit_tf_threads, no_document_error,
    other_shard_sets, publish_shards, ragged_to_numpy, read_documents, remove_files,
    sidecar_common, single_document_error, tokenize_documents)
from data_prep.pretraining_job import check_outputs as job_check_outputs

# Flag names are Google's, which other BERT tools reuse (input_file, vocab_file,
# max_seq_length, ...). allow_override lets such modules be imported into one process (a
# test session) without absl's DuplicateFlagError; each process still runs one tool.
_SHARED = {"allow_override": True}

_INPUT_FILE = flags.DEFINE_string(
    "input_file", None, "Input text file(s): comma-separated list, globs allowed; one sentence "
    "per line, blank line between documents (.gz files are read decompressed).", **_SHARED)
_OUTPUT_FILE = flags.DEFINE_string(
    "output_file", None, "Output TFRecord file(s), comma-separated; or a prefix when "
    "--num_output_shards is set.", **_SHARED)
_VOCAB_FILE = flags.DEFINE_string(
    "vocab_file", None, "WordPiece vocabulary, one token a line.", **_SHARED)
_TOKENIZER_FLAGS = tokenizer_config.define_flags()
_DO_WHOLE_WORD_MASK = flags.DEFINE_bool(
    "do_whole_word_mask", False, "Mask whole words rather than single WordPieces.", **_SHARED)
_MAX_SEQ_LENGTH = flags.DEFINE_integer(
    "max_seq_length", 128, "Maximum sequence length.", **_SHARED)
# masked_lm_prob and max_predictions_per_seq default to None here as in run_pretraining,
# which defines the same names (they share absl's FLAGS when both are imported, as in the
# tests); spec_from_flags applies Google's defaults, 0.15 and 20.
_DEFAULT_MASKED_LM_PROB, _DEFAULT_MAX_PREDICTIONS = 0.15, 20
_MAX_PREDICTIONS = flags.DEFINE_integer(
    "max_predictions_per_seq", None, "Maximum number of masked LM predictions per sequence "
    "(default 20).", **_SHARED)
_RANDOM_SEED = flags.DEFINE_integer(
    "random_seed", 12345, "Random seed for data generation.", **_SHARED)
_DUPE_FACTOR = flags.DEFINE_integer(
    "dupe_factor", 10, "Number of times to duplicate the input data (with different masks); "
    "1 by default with --dynamic_masking.", **_SHARED)
_DYNAMIC_MASKING = flags.DEFINE_bool(
    "dynamic_masking", False, "Write instances without masks; run_pretraining masks them "
    "anew on every pass (its --masked_lm_prob, --do_whole_word_mask).", **_SHARED)
_MASKED_LM_PROB = flags.DEFINE_float(
    "masked_lm_prob", None, "Masked LM probability (default 0.15).", **_SHARED)
_SHORT_SEQ_PROB = flags.DEFINE_float(
    "short_seq_prob", 0.1, "Probability of creating sequences shorter than the maximum length.",
    **_SHARED)
_NUM_WORKERS = flags.DEFINE_integer(
    "num_workers", 1, "Worker processes; documents are dealt round-robin; output depends on it.",
    **_SHARED)
_NUM_OUTPUT_SHARDS = flags.DEFINE_integer(
    "num_output_shards", None, "Write this many shards named "
    "<output_file>-NNNNN-of-MMMMM.tfrecord[.gz] (a .tfrecord suffix of --output_file "
    "dropped); must be >= --num_workers. Beam runners "
    "without it: that naming, one shard per worker or per ~128 MB of records, whichever "
    "is more.", **_SHARED)
_GZIP_COMPRESS = flags.DEFINE_bool(
    "gzip_compress", False, "Write GZIP-compressed TFRecords (Model Garden's flag name).",
    **_SHARED)
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace existing output files.", **_SHARED)
_RANDOM_DOC_POOL_SIZE = flags.DEFINE_integer(
    "random_doc_pool_size", 10_000, "Recent documents kept per worker to draw NotNext "
    "segments from (bounded memory; see pretraining_instances.OtherDocumentPool).", **_SHARED)
_SHUFFLE_BUFFER_SIZE = flags.DEFINE_integer(
    "shuffle_buffer_size", 50_000, "Instances held per worker to shuffle the output order.",
    **_SHARED)
_RUNNER = flags.DEFINE_string(
    "runner", "local", "'local' (this machine, --num_workers processes) or an Apache Beam "
    "runner: DirectRunner, DataflowRunner, FlinkRunner, SparkRunner, PortableRunner, "
    "PrismRunner (data_prep/beam_pipeline.py).", **_SHARED)
_BEAM_PIPELINE_OPTIONS = flags.DEFINE_string(
    "beam_pipeline_options", "", "Beam pipeline options, comma-separated key=value (the TFDS "
    "convention), e.g. direct_num_workers=2,direct_running_mode=multi_processing or "
    "project=P,region=R,temp_location=gs://B/tmp. Only with a Beam --runner.", **_SHARED)
_BEAM_BUCKET_MB = flags.DEFINE_float(
    "beam_bucket_mb", 4.0, "Beam runners: documents are hashed into buckets of about this "
    "many MB of input (~1,000 Wikipedia articles); NotNext segments come from another "
    "document of the same bucket (at most --random_doc_pool_size of them are pooled).",
    **_SHARED)
_NUM_EXAMPLES_TO_PRINT = flags.DEFINE_integer(
    "num_examples_to_print", 1, "Log this many first instances, decoded to WordPieces, for a "
    "human check: compactly (masked positions as [MASK]>label, with the masking counts), or "
    "in full with --print_full_examples.", **_SHARED)
_PRINT_FULL_EXAMPLES = flags.DEFINE_bool(
    "print_full_examples", False, "Log the --num_examples_to_print instances in full, as "
    "Google's tool does: tokens, segment_ids, is_random_next, masked_lm_positions and "
    "masked_lm_labels.", **_SHARED)

_PROGRESS_SECONDS = 2.0


# --- One worker: read, tokenize, make instances, shuffle, write its shards. ---


def worker_rng(random_seed: int, worker: int) -> random.Random:
    """The random source of one worker (string seeds are hashed with SHA-512, not hash())."""
    return random.Random(f"bert-keras/create_pretraining_data/{random_seed}/{worker}")


def shards_of_worker(num_shards: int, num_workers: int, worker: int) -> list[int]:
    """Shard indices written by `worker`: j with j % num_workers == worker."""
    return [j for j in range(num_shards) if j % num_workers == worker]


def _decode_examples(batch: pi.InstanceBatch, vocab: Sequence[str], count: int,
                     full: bool = False, dynamic: bool = False) -> list[str]:
    """The first `count` instances of a batch, decoded to WordPieces for a human check.

    Compact (the default): the WordPieces on wrapped lines, each masked position written
    `shown>label` (`[MASK]>word`, `random>word`, `word>word` when left unchanged), and the
    masking counts. `full`: Google's log layout (tokens, segment_ids, is_random_next,
    masked_lm_positions, masked_lm_labels). With `dynamic` masking the data holds no masks
    and both say so instead of printing empty lines.
    """
    out = []
    for i in range(min(count, len(batch.input_ids))):
        length = int(batch.input_mask[i].sum())
        n_masked = int(batch.masked_lm_weights[i].sum())
        tokens = [vocab[t] for t in batch.input_ids[i, :length].tolist()]
        labels = [vocab[t] for t in batch.masked_lm_ids[i, :n_masked].tolist()]
        positions = batch.masked_lm_positions[i, :n_masked].tolist()
        random_next = bool(batch.next_sentence_labels[i])
        no_masks = "none in the data (--dynamic_masking: run_pretraining masks on every pass)"
        if full:
            out.append(
                "*** Example ***\n"
                f"tokens: {' '.join(tokens)}\n"
                f"segment_ids: {' '.join(map(str, batch.segment_ids[i, :length].tolist()))}\n"
                f"is_random_next: {random_next}\n"
                + (f"masked_lm_positions: {no_masks}\nmasked_lm_labels: {no_masks}" if dynamic
                   else f"masked_lm_positions: {' '.join(map(str, positions))}\n"
                        f"masked_lm_labels: {' '.join(labels)}"))
            continue
        segment_a = int((batch.segment_ids[i, :length] == 0).sum())
        shown = list(tokens)
        kinds = {"[MASK]": 0, "random": 0, "unchanged": 0}
        for position, label in zip(positions, labels):
            token = tokens[position]
            kind = ("[MASK]" if token == "[MASK]" else "unchanged" if token == label
                    else "random")
            kinds[kind] += 1
            shown[position] = f"{token}>{label}"
        real = length - tokens.count("[CLS]") - tokens.count("[SEP]")
        if dynamic:
            masking = f"masks: {no_masks}"
        else:
            share = 100.0 * n_masked / max(real, 1)
            masking = (f"masks: {n_masked} of {real} tokens ({share:.0f}%): "
                       + ", ".join(f"{n} {kind}" for kind, n in kinds.items()))
        out.append(
            f"example instance {i + 1}: {length} WordPieces (segment A {segment_a}, B "
            f"{length - segment_a}; B is {'a random segment' if random_next else 'the next one'}); "
            f"{masking}\n" + "\n".join(f"  {line}" for line in textwrap.wrap(
                " ".join(shown), 96, break_long_words=False, break_on_hyphens=False)))
    if out and not full:
        out[-1] += "\n  (--print_full_examples logs them in Google's full layout)"
    return out


def _shard_open_failure(e, temp: str, final: str) -> files.OutputWriteError:
    """The error to raise where TensorFlow could not open the shard `final` under its
    temporary name `temp` ("<temp>; Permission denied", "<temp>; Not a directory"): one line
    naming `final` once, as every write failure does (before: "cannot write <temp>: <temp>;
    Permission denied")."""
    try:  # its place, probed again now, says best why (a file in the way, whose directory)
        files.check_writable([final])
    except files.OutputWriteError as unwritable:
        return unwritable
    error = files.output_write_error(e, temp, final)
    if error is not None:
        return error
    reason = str(e.message).rsplit("; ", 1)[-1].strip()
    code = next((c for c in sorted(errno.errorcode) if os.strerror(c) == reason), errno.EIO)
    return files.OutputWriteError(
        code, f"cannot be written: {reason[:1].lower() + reason[1:]}; write elsewhere", final)


def run_worker(spec: JobSpec, worker: int, report: Callable[[tuple], None],
               parent_pid: int | None = None) -> WorkerResult:
    """Does one worker's share: its documents in, its shards (under temporary names) out.

    Args:
      spec: the job.
      worker: index in [0, spec.num_workers).
      report: receives ("progress", worker, documents, instances, input_bytes) every few
        seconds and ("examples", [str]) once from worker 0.
      parent_pid: if set, the worker stops when its parent process is gone.

    Returns:
      WorkerResult with counters and instances per shard.

    Raises:
      InputError: bad input (unreadable, binary, too few documents, ...). The worker's
        temporary shards are removed before it raises.
    """
    started = time.monotonic()
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    limit_tf_threads(tf)
    from data_prep.tokenization import BertTokenizer  # pylint: disable=g-import-not-at-top

    tokenizer = BertTokenizer.from_config(spec.vocab_file, spec.tokenizer)
    vocab = list(tokenizer.vocab)
    special = pi.SpecialTokens.from_vocab(vocab)

    tokenize_graph = tf.function(tokenizer.__call__, autograph=False,
                                 input_signature=[tf.TensorSpec([None], tf.string)])

    def tokenize(lines: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return ragged_to_numpy(tokenize_graph(tf.constant(lines)))

    result = WorkerResult(worker=worker, stats=pi.InstanceStats(), input_bytes=0, shard_counts={})
    work_start, work_cpu_start = time.monotonic(), time.process_time()
    result.setup_seconds = work_start - started
    shard_ids = shards_of_worker(len(spec.output_files), spec.num_workers, worker)
    temps = [_temp_files(spec)[j] for j in shard_ids]
    options = tf.io.TFRecordOptions(compression_type="GZIP" if spec.gzip else "")
    writers = []
    try:
        for j, t in zip(shard_ids, temps):
            try:
                writers.append(tf.io.TFRecordWriter(t, options))
            except tf.errors.OpError as e:
                raise _shard_open_failure(e, t, spec.output_files[j]) from None
        rng = worker_rng(spec.random_seed, worker)
        shuffler = ShuffleBuffer(spec.shuffle_buffer_size, random.Random(rng.getrandbits(64)))
        counts = [0] * len(writers)
        written = 0

        def write(records: list[bytes]) -> None:
            # Record number g of this worker goes to its shard g % n (Google's round-robin).
            nonlocal written
            n = len(writers)
            for k, w in enumerate(writers):
                part = records[(k - written) % n::n]
                for record in part:
                    w.write(record)
                counts[k] += len(part)
            written += len(records)

        def documents() -> Iterator[pi.Document]:
            raw = read_documents(spec.input_files, worker, spec.num_workers, warnings=result)
            for doc, nbytes in tokenize_documents(raw, tokenize):
                result.input_bytes += nbytes
                yield doc

        to_print = spec.num_examples_to_print if worker == 0 else 0
        last_report = time.monotonic()
        stats = result.stats
        for batch in pi.generate_instances(documents(), spec.config, special, rng, stats):
            if to_print > 0:
                report(("examples", _decode_examples(batch, vocab, to_print,
                                                     full=spec.print_full_examples,
                                                     dynamic=spec.config.dynamic_masking)))
                to_print = 0
            masks = ((None,) * 3 if spec.config.dynamic_masking else
                     (batch.masked_lm_positions, batch.masked_lm_ids, batch.masked_lm_weights))
            records = features.serialize_examples(
                batch.input_ids, batch.input_mask, batch.segment_ids, *masks,
                batch.next_sentence_labels)
            write(shuffler.push(records))
            now = time.monotonic()
            if now - last_report >= _PROGRESS_SECONDS:
                last_report = now
                if parent_pid is not None and os.getppid() != parent_pid:
                    raise InputError(f"worker {worker}: parent process {parent_pid} is gone")
                report(("progress", worker, stats.documents, stats.instances, result.input_bytes))
        write(shuffler.drain())
        for w in writers:
            w.close()
        result.shard_counts = dict(zip(shard_ids, counts))
        result.work_seconds = time.monotonic() - work_start
        result.work_cpu_seconds = time.process_time() - work_cpu_start
        report(("progress", worker, stats.documents, stats.instances, result.input_bytes))
        return result
    except ValueError as e:  # instance creation's checks (too few documents, ...)
        for w in writers:
            w.close()
        remove_files(temps)
        if isinstance(e, pi.TooFewDocumentsError):
            # One worker's count is the corpus's; with several, the corpus may have enough
            # for one worker when this share has not.
            corpus = e.count if spec.num_workers == 1 else result.corpus_documents
            if corpus == 0:
                raise no_document_error(spec.input_files) from None
            if corpus == 1:
                raise single_document_error(spec.input_files) from None
        if isinstance(e, pi.TooFewDocumentsError) and spec.num_workers > 1:
            # The corpus may have enough; this worker's share (every n-th document) has not.
            raise InputError(
                f"its share of the corpus (one document in {spec.num_workers}) holds "
                f"{e.count} document{'s' if e.count != 1 else ''} with text, and each worker "
                "needs at least 2 (NotNext segments come from another document of its share); "
                "use fewer --num_workers for this corpus") from None
        raise InputError(str(e)) from None
    except BaseException:
        for w in writers:
            w.close()
        remove_files(temps)
        raise


class ShuffleBuffer:
    """Shuffles a stream of records in bounded memory (random replacement).

    The first `size` records fill the buffer; then each incoming record takes the slot of a
    random resident, which is emitted. Slots for a batch are drawn without replacement, so a
    whole batch is exchanged with two numpy fancy-index operations.

    Args:
      size: records held (>= 1).
      rng: random source.
    """

    def __init__(self, size: int, rng: random.Random):
        self.size = size
        self._np_rng = np.random.default_rng(rng.getrandbits(64))
        self._items = np.empty(size, object)
        self._count = 0

    def push(self, records: Sequence[bytes]) -> list[bytes]:
        """Adds records; returns those that leave the buffer (in output order)."""
        out: list[bytes] = []
        start = 0
        if self._count < self.size:
            start = min(len(records), self.size - self._count)
            self._items[self._count:self._count + start] = _object_array(records[:start])
            self._count += start
        while start < len(records):
            chunk = records[start:start + self.size]
            slots = self._np_rng.choice(self.size, size=len(chunk), replace=False)
            out.extend(self._items[slots].tolist())
            self._items[slots] = _object_array(chunk)
            start += len(chunk)
        return out

    def drain(self) -> list[bytes]:
        """Returns the remaining records in random order and empties the buffer."""
        order = self._np_rng.permutation(self._count)
        out = self._items[:self._count][order].tolist()
        self._items[:] = None
        self._count = 0
        return out


def _object_array(items: Sequence[bytes]) -> np.ndarray:
    array = np.empty(len(items), object)
    array[:] = list(items)
    return array


def _worker_entry(spec: JobSpec, worker: int, messages, parent_pid: int) -> None:
    """Entry point of a spawned worker: reports ("done", result) or ("error", text, whether
    the corpus as a whole is at fault: a CorpusError, which every worker finds)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        result = run_worker(spec, worker, messages.put, parent_pid=parent_pid)
        messages.put(("done", worker, result))
    except BaseException as e:  # pylint: disable=broad-except
        # The error boundary's line for what it expects (a shard that could not be written
        # for want of room is TensorFlow's OpError); a bug's traceback.
        from data_prep import cli

        line = cli.expected_error_line(e, (ValueError, OSError))
        messages.put(("error", worker, line if line is not None else traceback.format_exc(),
                      isinstance(e, CorpusError)))


# --- The whole run: workers, checks, sidecars, renames. ---


def _temp_files(spec: JobSpec) -> tuple[str, ...]:
    """Where the shards are written until the run succeeds (named after the parent process)."""
    return spec.temp_files or tuple(files.temp_path(p) for p in spec.output_files)


def check_outputs(spec: JobSpec) -> list[str]:
    """The shared output checks (`pretraining_job.check_outputs`: existing files, other shard
    sets of the prefix, directories), and enough shards for the workers.

    Returns:
      The directories it created (`files.remove_created_dirs` takes them back on failure).

    Raises:
      InputError: naming the existing files, or a bad output list.
    """
    if spec.output_files and spec.num_workers > len(spec.output_files):
        raise InputError(
            f"--num_workers={spec.num_workers} needs at least as many output files; received "
            f"{len(spec.output_files)} (use --num_output_shards)")
    return job_check_outputs(spec)


class _Progress:
    """Aggregates worker progress and logs it."""

    def __init__(self, num_workers: int, log: Callable[..., None]):
        self.state = {w: (0, 0, 0) for w in range(num_workers)}
        self.start = time.monotonic()
        self.log = log

    def __call__(self, message: tuple) -> None:
        if message[0] == "examples":
            for text in message[1]:
                self.log("%s", text)
            return
        _, worker, docs, instances, nbytes = message
        self.state[worker] = (docs, instances, nbytes)
        docs, instances, nbytes = (sum(v[i] for v in self.state.values()) for i in range(3))
        seconds = max(time.monotonic() - self.start, 1e-9)
        self.log("documents %s, instances %s, %.1f MB of text in %.1f s (%.2f MB/s)",
                 f"{docs:,}", f"{instances:,}", nbytes / 1e6, seconds, nbytes / 1e6 / seconds)


def _run_spawned(spec: JobSpec, progress: _Progress) -> list[WorkerResult]:
    ctx = multiprocessing.get_context("spawn")  # TensorFlow and fork do not mix
    messages = ctx.Queue()
    procs = [ctx.Process(target=_worker_entry, args=(spec, w, messages, os.getpid()),
                         name=f"create_pretraining_data-worker-{w}", daemon=True)
             for w in range(spec.num_workers)]
    for p in procs:
        p.start()
    results: dict[int, WorkerResult] = {}
    errors: dict[int, str] = {}
    corpus_errors: set[int] = set()  # workers whose error is the corpus's (CorpusError)
    try:
        while len(results) + len(errors) < len(procs) and not errors:
            try:
                message = messages.get(timeout=1.0)
            except queue.Empty:
                dead = [w for w, p in enumerate(procs)
                        if w not in results and not p.is_alive()]
                if not dead:
                    continue
                try:  # a dead worker's last message may still be in flight
                    message = messages.get(timeout=2.0)
                except queue.Empty:
                    errors[dead[0]] = f"died (exit code {procs[dead[0]].exitcode})"
                    continue
            if message[0] == "done":
                results[message[1]] = message[2]
            elif message[0] == "error":
                errors[message[1]] = message[2]
                if message[3]:
                    corpus_errors.add(message[1])
            else:
                progress(message)
    finally:
        for p in procs:
            if p.is_alive() and (errors or len(results) < len(procs)):
                p.terminate()
        for p in procs:
            p.join(timeout=30)
    if errors:
        worker = min(errors)
        if worker in corpus_errors:  # one line, as one worker gives it
            raise CorpusError(errors[worker])
        raise InputError(f"worker {worker} of {spec.num_workers}: {errors[worker]}")
    return [results[w] for w in range(spec.num_workers)]


def run(spec: JobSpec, log: Callable[..., None] | None = None,
        warn: Callable[..., None] | None = None) -> dict:
    """Runs a whole job: workers, checks, sidecars, then renames shards to their final names.

    Args:
      spec: the job.
      log: printf-style logger for progress and the summary (default: absl logging.info).
      warn: printf-style logger for what the user should look at (uneven shards, long lines,
        dropped bytes, [UNK] share; default: absl logging.warning, which --verbosity=-1,
        the setting that hides the progress lines, still shows).

    Returns:
      Summary dict (totals, per-shard counts, seconds, MB/s).

    Raises:
      InputError: bad input or settings; no file is left under a final name.
    """
    log = log or logging.info
    warn = warn or logging.warning
    created = check_outputs(spec)
    shards, workers = len(spec.output_files), spec.num_workers
    if shards % workers:
        # Worker w writes shards w, w + n, ...: its share of the documents is split among
        # them, so the shards of workers with fewer shards hold more.
        most, fewest = (len(shards_of_worker(shards, workers, w)) for w in (0, workers - 1))
        warn("%d shards for %d workers: worker 0 writes %d of them and worker %d "
             "%d, so their shards differ in size (about %.1fx); a multiple of --num_workers "
             "gives shards of one size", shards, workers, most, workers - 1, fewest,
             most / fewest)
    if not spec.temp_files:
        spec = dataclasses.replace(spec, temp_files=_temp_files(spec))
    temps = list(spec.temp_files)
    for path in spec.output_files:
        files.remove_stale_temps(path)
        files.remove_stale_temps(features.sidecar_path(path))
    start = time.monotonic()
    progress = _Progress(spec.num_workers, log)
    try:
        if spec.num_workers == 1:
            results = [run_worker(spec, 0, progress)]
        else:
            results = _run_spawned(spec, progress)
        totals = pi.InstanceStats()
        for r in results:
            totals.merge(r.stats)
        check_totals(totals, results, spec, warn)
        seconds = time.monotonic() - start
        input_bytes = sum(r.input_bytes for r in results)
        shard_counts = {j: n for r in results for j, n in r.shard_counts.items()}
        vocab_sha = files.sha256_file(spec.vocab_file)
        common = sidecar_common(spec, totals, input_bytes, vocab_sha)
        if not spec.overwrite:
            check_outputs(spec)  # nothing appeared meanwhile
        replaced = other_shard_sets(spec.output_files) if spec.overwrite else []
        publish_shards(temps, spec.output_files, [
            dict(common, shard={"index": j, "num_shards": len(spec.output_files),
                                "instances": shard_counts.get(j, 0),
                                "worker": j % spec.num_workers})
            for j in range(len(spec.output_files))], spec.overwrite, replaced)
    except BaseException:
        remove_files(temps)
        files.remove_created_dirs(created)
        raise
    mb = input_bytes / 1e6
    masked = ("masks left to the trainer (--dynamic_masking)" if spec.config.dynamic_masking
              else f"masked {100.0 * totals.masked / max(totals.real_tokens, 1):.2f}% of real "
                   "tokens")
    log("wrote %s instances from %s documents (%.1f MB of text) to %d shard(s) in %.1f s "
        "(%.2f MB/s); NotNext %.1f%%, %s",
        f"{totals.instances:,}", f"{totals.documents:,}", mb, len(spec.output_files), seconds,
        mb / max(seconds, 1e-9), 100.0 * totals.not_next / max(totals.instances, 1), masked)
    work = max(r.work_seconds for r in results)
    cpu = sum(r.work_cpu_seconds for r in results)
    log("timing: start-up (TensorFlow, tokenizer) %.1f s; work %.1f s wall (%.2f MB/s), "
        "%.1f s CPU in %d worker(s) (%.2f MB per CPU-second)",
        max(r.setup_seconds for r in results), work, mb / max(work, 1e-9), cpu,
        len(results), mb / max(cpu, 1e-9))
    for path in spec.output_files:
        log("  %s", path)
    if replaced:
        log("--overwrite: removed the prefix's other outputs, %s",
            describe_shard_sets(replaced))
    return {"totals": dataclasses.asdict(totals), "input_bytes": input_bytes,
            "shard_counts": [shard_counts.get(j, 0) for j in range(len(spec.output_files))],
            "seconds": seconds, "mb_per_second": mb / max(seconds, 1e-9),
            "work_seconds": work, "work_cpu_seconds": cpu}


# --- Command line. ---


def output_files_from_flags(output_file: str, num_output_shards: int | None,
                            gzip_compress: bool) -> list[str]:
    """Expands --output_file / --num_output_shards into shard paths.

    Raises:
      InputError: a comma list combined with --num_output_shards, or a bad shard count.
    """
    for path in output_file.split(","):
        if files.names_a_directory(path.strip()):
            raise InputError(f"--output_file: {path.strip()} ends in '/', a directory; name a "
                             "file (or a prefix) in it")
    if num_output_shards is None:
        # An output that is a symbolic link is written where it points (files.output_path).
        return [files.output_path(p.strip()) for p in output_file.split(",") if p.strip()]
    if num_output_shards < 1:
        raise InputError(f"--num_output_shards must be >= 1; received {num_output_shards}")
    if "," in output_file:
        raise InputError("--num_output_shards takes a single --output_file prefix; received a "
                         f"comma-separated list: {output_file!r}")
    # Google's README names its output tf_examples.tfrecord: its shards are
    # tf_examples-00000-of-00004.tfrecord, not tf_examples.tfrecord-00000-of-00004.tfrecord.
    prefix = files.output_prefix(output_file)
    return [files.output_path(files.shard_path(prefix, j, num_output_shards, gzip_compress))
            for j in range(num_output_shards)]


def _value_or(holder, default):
    """The flag's value, or `default` where it is unset (None)."""
    value = holder.value
    return default if value is None else value


def spec_from_flags(expand_inputs: Callable[[str], list[str]] = features.expand_input_files
                    ) -> JobSpec:
    """Reads and checks the flags (the only place they are read).

    Args:
      expand_inputs: --input_file -> sorted file list (raises ValueError if a pattern matches
        nothing); the Beam path passes one that knows every Beam file system.
    """
    try:
        input_files = expand_inputs(_INPUT_FILE.value)
        empty = [p for p in input_files if os.path.isfile(p) and os.path.getsize(p) == 0]
        if empty:
            raise InputError(f"input file {empty[0]} is empty; expected text, one sentence a "
                             "line, a blank line between documents")
    except ValueError as e:
        raise InputError(f"--input_file: {e}") from None
    vocab_file = _VOCAB_FILE.value
    try:  # missing, a directory, [CLS], [SEP], [MASK], ...: refused before anything is made
        schema.load_vocab(vocab_file)
    except schema.VocabError as e:
        raise InputError(f"--vocab_file: {e}") from None
    tokenizer, tokenizer_source = tokenizer_config.resolve(
        vocab_file, tokenizer_config.overrides_from_flags(_TOKENIZER_FLAGS), warn=logging.warning)
    dynamic = _DYNAMIC_MASKING.value
    if dynamic:
        given = [h.name for h in (_MASKED_LM_PROB, _MAX_PREDICTIONS, _DO_WHOLE_WORD_MASK)
                 if h.present]
        if given:
            raise InputError(
                f"--{given[0]} does not apply with --dynamic_masking: masks are chosen at "
                f"training time (run_pretraining --{given[0]})")
    dupe_factor = _DUPE_FACTOR.value
    if dynamic and not _DUPE_FACTOR.present:
        dupe_factor = 1  # Every pass of the trainer masks anew: copies add nothing.
    try:
        config = pi.InstanceConfig(
            max_seq_length=_MAX_SEQ_LENGTH.value,
            max_predictions_per_seq=_value_or(_MAX_PREDICTIONS, _DEFAULT_MAX_PREDICTIONS),
            masked_lm_prob=_value_or(_MASKED_LM_PROB, _DEFAULT_MASKED_LM_PROB),
            short_seq_prob=_SHORT_SEQ_PROB.value,
            dupe_factor=dupe_factor,
            do_whole_word_mask=_DO_WHOLE_WORD_MASK.value,
            pool_size=_RANDOM_DOC_POOL_SIZE.value,
            dynamic_masking=dynamic)
    except ValueError as e:  # "<field> must be ...": named by its flag
        field, rest = str(e).split(" ", 1)
        flag = {"pool_size": _RANDOM_DOC_POOL_SIZE.name}.get(field, field)
        raise InputError(f"--{flag} {rest}") from None
    if _NUM_WORKERS.value < 1:
        raise InputError(f"--num_workers must be >= 1; received {_NUM_WORKERS.value}")
    if _SHUFFLE_BUFFER_SIZE.value < 1:
        raise InputError(f"--shuffle_buffer_size must be >= 1; received "
                         f"{_SHUFFLE_BUFFER_SIZE.value}")
    outputs = output_files_from_flags(_OUTPUT_FILE.value, _NUM_OUTPUT_SHARDS.value,
                                      _GZIP_COMPRESS.value)
    holders = [v for k, v in globals().items()
               if k.startswith("_") and isinstance(v, flags.FlagHolder)]
    # The tokenizer flags where given: their defaults are not what ran when the settings
    # came from the vocabulary's tokenizer_config.json (the sidecar's top-level keys say
    # what ran).
    holders += [h for h in _TOKENIZER_FLAGS.values() if h.present]
    flag_values = dict((h.name, h.value) for h in holders)
    flag_values["dupe_factor"] = dupe_factor
    flag_values = tuple(sorted(flag_values.items()))
    return JobSpec(
        input_files=tuple(input_files), output_files=tuple(outputs), vocab_file=vocab_file,
        tokenizer=tokenizer, tokenizer_source=tokenizer_source, config=config,
        random_seed=_RANDOM_SEED.value, num_workers=_NUM_WORKERS.value,
        gzip=_GZIP_COMPRESS.value, shuffle_buffer_size=_SHUFFLE_BUFFER_SIZE.value,
        num_examples_to_print=_NUM_EXAMPLES_TO_PRINT.value,
        print_full_examples=_PRINT_FULL_EXAMPLES.value, overwrite=_OVERWRITE.value,
        flag_values=flag_values)


def main(argv: Sequence[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from data_prep import cli

    def body() -> int:
        if _RUNNER.value != "local":
            return _main_beam()
        if _BEAM_PIPELINE_OPTIONS.value:
            raise InputError("--beam_pipeline_options needs a Beam --runner (e.g. "
                             "--runner=DirectRunner); received --runner=local")
        spec = spec_from_flags()
        logging.info("reading %d input file(s), e.g. %s; writing %d shard(s) with %d worker(s)",
                     len(spec.input_files), spec.input_files[0], len(spec.output_files),
                     spec.num_workers)
        logging.info("tokenizer settings: %s (%s)", spec.tokenizer.describe(),
                     spec.tokenizer_source or "defaults and flags")
        run(spec)
        return 0

    # InputError, VocabError, ...: their messages name the file or flag.
    return cli.report_errors(body, (ValueError, OSError))


def _main_beam() -> int:
    """--runner names a Beam runner: check everything, then run data_prep.beam_pipeline."""
    from data_prep import beam_pipeline  # pylint: disable=g-import-not-at-top
    options = beam_pipeline.pipeline_options(_RUNNER.value, _BEAM_PIPELINE_OPTIONS.value)
    if _NUM_WORKERS.value != 1:
        raise InputError(f"--num_workers={_NUM_WORKERS.value} is for --runner=local; Beam "
                         "runners take their workers from --beam_pipeline_options (e.g. "
                         "direct_num_workers=2, or max_num_workers=N on Dataflow)")
    # What the Beam job does otherwise (its shuffle is global; its workers print nothing):
    # refused, not silently dropped.
    local_only = [h.name for h, asked in (
        (_SHUFFLE_BUFFER_SIZE, _SHUFFLE_BUFFER_SIZE.value != _SHUFFLE_BUFFER_SIZE.default),
        (_NUM_EXAMPLES_TO_PRINT, _NUM_EXAMPLES_TO_PRINT.present
         and _NUM_EXAMPLES_TO_PRINT.value > 0),
        (_PRINT_FULL_EXAMPLES, _PRINT_FULL_EXAMPLES.value)) if asked]
    if local_only:
        raise InputError(f"--{local_only[0]} is for --runner=local; a Beam job shuffles its "
                         "instances globally and prints none (run the local tool on a sample "
                         "to see them)")
    spec = spec_from_flags(expand_inputs=beam_pipeline.expand_input_files)
    if _NUM_OUTPUT_SHARDS.value is None and len(spec.output_files) == 1:
        # One --output_file without --num_output_shards: shards named after it, as many as
        # the runner's workers and the data call for (one file cannot be split by readers).
        count = beam_pipeline.default_num_shards(options, spec.input_files,
                                                 spec.config.dupe_factor)
        spec = dataclasses.replace(spec, output_files=tuple(
            output_files_from_flags(spec.output_files[0], count, spec.gzip)))
    logging.info("Beam %s: %d input file(s), e.g. %s; writing %d shard(s)", _RUNNER.value,
                 len(spec.input_files), spec.input_files[0], len(spec.output_files))
    logging.info("tokenizer settings: %s (%s)", spec.tokenizer.describe(),
                 spec.tokenizer_source or "defaults and flags")
    beam_pipeline.run(spec, options, bucket_mb=_BEAM_BUCKET_MB.value)
    return 0


if __name__ == "__main__":
    from data_prep import cli

    cli.mark_required(["input_file", "output_file", "vocab_file"])
    cli.run(main)
