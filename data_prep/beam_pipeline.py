r"""Pretraining data on Apache Beam: the same records on a laptop, Dataflow, Flink or Spark.

`python -m data_prep.create_pretraining_data --runner=DirectRunner ...` (or DataflowRunner,
FlinkRunner, SparkRunner, PortableRunner, PrismRunner) runs this pipeline instead of the
local generator. Every flag keeps its meaning; the instance-building algorithm is the one
of data_prep/pretraining_instances.py (create_pairs_from_document, finish_instances), the
reader, tokenizer batching and checks those of data_prep/pretraining_job.py, which the local
tool uses too.

The pipeline:

  file paths -> ReadDocuments: each file read sequentially, line by line (never held whole);
                a document (lines up to a blank line) is emitted whole, never split
             -> Reshuffle -> Tokenize (batches of ~512 KB of text; empty documents dropped)
             -> key by bucket: hash(seed, document id) mod B, B = max(1, round(input MB /
                --beam_bucket_mb)), fixed at launch from the input files' sizes (no global
                count, no side input: the stage fuses with tokenization)
             -> GroupByKey -> MakeInstances per bucket, documents in id order: pass 1
                picks the NotNext pool, the (at most --random_doc_pool_size) documents of
                the bucket with the smallest hash(seed, id), each kept as a window of
                4 * max_seq_length tokens; pass 2 makes each document's sentence pairs
                (dupe_factor passes) with the document's own random source, then truncates
                and masks them in batches of whole documents (~1024 pairs, seeded by the
                batch's first document)
             -> key by hash(seed, record) -> shard = key mod num_shards -> GroupByKey ->
                WriteShard: records sorted by key (a global shuffle: one document's records
                land in every shard, in no particular order), written under a hidden
                temporary name (`.incomplete-<pid>.<name>`)
  counters (documents, instances, masked tokens, per-shard records...) -> one JSON summary.

After the job the launcher checks each temporary shard's framing and record count against
the summary, writes the sidecars (`<shard>.meta.json`, the local tool's format) and renames
the shards into place. A failed or cancelled job leaves no file under a final name (and no
sidecar): only hidden `.incomplete-*` files, which readers skip and the next run removes.

Determinism: every random choice is seeded from (seed, document id) or (seed, record), and
a document id is (file index in the sorted input list, document number in its file). So the
same input, flags, seed and shard count give byte-identical shards for any runner, worker
count, bundle split or rerun (a retried bundle rewrites the same bytes). The records differ
from the local tool's (which draws per worker, in stream order), with the same statistics.

Sharding: --num_output_shards is exact. Without it (one --output_file), the shards take the
same names (`<output_file>-NNNNN-of-MMMMM.tfrecord`, a .tfrecord suffix of --output_file
dropped, as with it) and their number is the runner's worker count (`runner_workers`) or one per ~128 MB
of records, whichever is more (`default_num_shards`): a single file cannot be split among
readers. That count depends on the workers requested, so give --num_output_shards for the
same bytes from runs with other worker counts.

Memory per worker: one bucket's documents (~4 MB of text by default, sorted by id); the pool holds at most
--random_doc_pool_size windows (20 MB at the defaults); WriteShard sorts one shard's records
in memory, so choose --num_output_shards to keep a shard at a few hundred MB (Google's
recommendation of many shards does that). That is what a distributed runner's workers hold;
DirectRunner itself keeps every collection between stages in the launcher's memory (~3 GB
for 100 MB of text, BUILD_NOTES.md section 8.2), so it suits corpora of a few hundred MB at most.

The launcher also checks that every document read was tokenized and turned into instances:
a first version of this pipeline (with a global count as a side input) lost documents on
DirectRunner's multi_processing mode at 100 MB without an error; that shape is gone, and a
runner that drops data now fails the job instead of publishing short shards.

NotNext: as in Google's tool the B segment comes from a uniformly drawn *other* document,
here of the same bucket. Buckets are random (a hash), so over the corpus every other document
is equally likely to be the source, as with Google's whole-corpus draw.
"""

from __future__ import annotations

import bz2
import contextlib
import dataclasses
import gzip
import hashlib
import heapq
import io
import json
import logging as _pylogging
import os
import random
import re
import shutil
import tempfile
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from absl import logging

from data_prep import features
from data_prep import files
from data_prep.cli import DEBUG_ENV
from data_prep import pretraining_instances as pi
from data_prep import pretraining_job as job
from data_prep import schema
from data_prep.pretraining_job import InputError

# Beam's INFO notes for its developers (BigQuery clients missing, type hints converted to
# Any) stay out of the tool's log, as `run` leaves the level after a job; BERT_KERAS_DEBUG
# shows them.
if not os.environ.get(DEBUG_ENV) and not _pylogging.getLogger("apache_beam").level:
    _pylogging.getLogger("apache_beam").setLevel(_pylogging.WARNING)
try:  # Beam is needed only with a Beam --runner; the local tool works without it.
    import apache_beam as beam
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems
    BEAM_IMPORT_ERROR = None
except ImportError as _e:  # pragma: no cover - depends on the environment
    beam = None
    BEAM_IMPORT_ERROR = _e

RUNNERS = ("DirectRunner", "PrismRunner", "DataflowRunner", "FlinkRunner", "SparkRunner",
           "PortableRunner")
_SUMMARY_SUFFIX = ".summary.json"
_HARNESS_LOG_LEVEL = "default_sdk_harness_log_level"


# --- Checks made before the pipeline starts. ---


def _require_beam(runner: str) -> None:
    if beam is None:
        raise InputError(f"--runner={runner} needs Apache Beam, which is not installed "
                         f"({BEAM_IMPORT_ERROR}); pip install 'apache-beam[tfrecord]==2.77'")


def parse_pipeline_options(text: str) -> list[str]:
    """`key=value,key=value` (TFDS's --beam_pipeline_options) -> ["--key=value", ...].

    A bare `key` becomes `--key` (a boolean option such as save_main_session).

    Raises:
      InputError: an empty or malformed item, naming it.
    """
    args = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        key = item.split("=", 1)[0].strip().lstrip("-")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise InputError(f"--beam_pipeline_options: {item!r} is not key=value (expected "
                             "comma-separated key=value, e.g. direct_num_workers=2)")
        args.append("--" + key + (("=" + item.split("=", 1)[1]) if "=" in item else ""))
    return args


def pipeline_options(runner: str, text: str):
    """Checks --runner and --beam_pipeline_options; returns Beam PipelineOptions.

    Raises:
      InputError: an unknown runner, a malformed or unknown option, or Beam missing.
    """
    if runner not in RUNNERS:
        raise InputError(f"--runner={runner!r} is not known; expected local or one of "
                         f"{', '.join(RUNNERS)}")
    _require_beam(runner)
    from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top
    args = parse_pipeline_options(text)
    if any(a.split("=", 1)[0] == "--runner" for a in args):
        raise InputError("--beam_pipeline_options: give the runner with --runner, not here")
    # DirectRunner's multi_processing workers are child processes logging to this terminal
    # at INFO (channels, harness start and exit: about 45 lines for 2 workers); their
    # warnings stay. default_sdk_harness_log_level given, or BERT_KERAS_DEBUG, keeps Beam's.
    if (runner == "DirectRunner" and not os.environ.get(DEBUG_ENV) and not any(
            a.split("=", 1)[0] == "--" + _HARNESS_LOG_LEVEL for a in args)):
        args = args + [f"--{_HARNESS_LOG_LEVEL}=WARNING"]
    if runner == "DirectRunner" and "--allow_unsafe_triggers" not in args:
        # Beam 2.77's DirectRunner first tries Prism (a Go binary fetched from GitHub; offline
        # that fails, behind a dropping firewall only after the TCP timeout), and the failed
        # start left its job server's `beam-temp*` and its stager's `tmp*` and
        # `beam-requirements-cache` directories in $TMPDIR on every run. A pipeline that
        # allows unsafe triggers is one DirectRunner does not give Prism, so it runs on the
        # in-process runner it fell back to (the same shards); this pipeline sets no
        # triggers. PrismRunner stays available as its own --runner.
        args = args + ["--allow_unsafe_triggers"]
    options = PipelineOptions(args + [f"--runner={runner}"])
    # Beam parses the options with argparse, which prints its whole usage and exits on a
    # bad value (direct_num_workers=abc): its last line, the error, is what is said.
    heard = io.StringIO()
    try:
        with contextlib.redirect_stderr(heard):
            known = options.get_all_options()
    except SystemExit:
        said = [line for line in heard.getvalue().splitlines() if "error:" in line]
        reason = said[-1].split("error:", 1)[1].strip() if said else "not accepted"
        raise InputError(f"--beam_pipeline_options: {reason}") from None
    unknown = sorted(set(options.get_all_options(retain_unknown_options=True)) - set(known))
    if unknown:
        raise InputError(f"--beam_pipeline_options: unknown Beam option(s) {', '.join(unknown)}"
                         " (see python -m apache_beam.examples.wordcount --help for the list)")
    return options


# Without --num_output_shards: about this many bytes of records per shard (estimated as
# input bytes x dupe_factor: a record of S tokens takes about as many bytes as its text).
DEFAULT_SHARD_BYTES = 128 * 1024 * 1024
# The options that say how many workers a runner has (DirectRunner's 0 = one per CPU).
_WORKER_OPTIONS = ("direct_num_workers", "num_workers", "max_num_workers", "parallelism")


def runner_workers(options) -> int:
    """The workers `options` give the runner (DirectRunner's direct_num_workers, Dataflow's
    num_workers / max_num_workers, Flink's parallelism), at least 1."""
    values = options.get_all_options(retain_unknown_options=True)
    found = [1]
    for name in _WORKER_OPTIONS:
        value = values.get(name)
        if name == "direct_num_workers" and value == 0:
            value = os.cpu_count() or 1
        if isinstance(value, int) and value > 0:
            found.append(value)
    return max(found)


def default_num_shards(options, input_files: Sequence[str], dupe_factor: int) -> int:
    """The shard count of a Beam run without --num_output_shards: one shard per worker of
    the runner (`runner_workers`), or one per ~DEFAULT_SHARD_BYTES of records, whichever is
    more, so that readers downstream can split the data and no shard grows without bound
    (WriteShard sorts one shard in memory)."""
    input_bytes = _input_bytes(input_files)
    by_size = -(-input_bytes * max(dupe_factor, 1) // DEFAULT_SHARD_BYTES)
    return max(runner_workers(options), int(by_size), 1)


def _is_data_name(path: str) -> bool:
    base = path.rstrip("/").rsplit("/", 1)[-1]
    return not (base.endswith(files.SIDECAR_SUFFIX) or files.is_temp_name(base))


class PipeInputError(ValueError):
    """An input is a pipe (`files.pipe_refusal`); not a failure to list a pattern."""


def expand_input_files(patterns: str) -> list[str]:
    """Expands --input_file (comma-separated globs) on any Beam file system.

    Raises:
      ValueError: a pattern matches no data file, or every matched file is empty.
    """
    _require_beam("a Beam runner")
    parts = files.split_patterns(
        patterns or "", lambda p: _exists(p) if "://" in p else os.path.lexists(p))
    if not parts:
        raise ValueError("no input file pattern given (expected a comma-separated list of "
                         "files or globs)")
    found: dict[str, int] = {}
    for pattern in parts:
        try:
            matches = _match_sizes(pattern)
        except PipeInputError as e:
            raise ValueError(str(e)) from None
        except Exception as e:  # BeamIOError, an unknown scheme, ...  pylint: disable=broad-except
            raise ValueError(f"cannot list {pattern!r}: {e}") from None
        matches = {path: size for path, size in matches.items() if _is_data_name(path)}
        if not matches:
            raise ValueError(f"input pattern {pattern!r} matches no data file")
        found.update(matches)
    if not any(found.values()):
        raise ValueError(f"the {len(found)} input file(s) are empty, e.g. {min(found)}; the "
                         "corpus needs at least 2 documents")
    return sorted(found)


# --- Deterministic randomness. ---


def _hash64(*parts: Any) -> int:
    text = "/".join(map(str, parts)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def _record_key(seed: int, record: bytes) -> int:
    return int.from_bytes(
        hashlib.blake2b(record, digest_size=8, key=str(seed).encode()[:64]).digest(), "little")


def document_rng(seed: int, purpose: str, doc_id: int) -> random.Random:
    """The random source of one document (string seeds are hashed with SHA-512)."""
    return random.Random(f"bert-keras/beam/{seed}/{purpose}/{doc_id}")


def document_id(file_index: int, number: int) -> int:
    """A document's id: its file's index in the sorted input list, its number in the file."""
    return (file_index << 40) | number


def num_buckets(input_bytes: int, bucket_mb: float) -> int:
    """Buckets for `input_bytes` of input (file sizes as stored) at ~`bucket_mb` MB each."""
    return max(1, int(round(input_bytes / (bucket_mb * 1e6))))


def bucket_of(seed: int, doc_id: int, buckets: int) -> int:
    return _hash64("bucket", seed, doc_id) % buckets


# --- Reading. ---


def open_any(path: str):
    """A binary file object with readline(size) for any Beam path (.gz and .bz2 read
    decompressed, as `files.open_input` reads local ones)."""
    raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    if path.endswith(".bz2"):
        return _Closing(bz2.BZ2File(raw, mode="rb"), raw)
    if not path.endswith(".gz"):
        return raw
    f = gzip.GzipFile(fileobj=raw, mode="rb")
    f.myfileobj = raw  # closing the GzipFile closes the underlying file too
    return f


class _Closing(io.BufferedReader):
    """A decompressing reader that closes the file beneath it too (BZ2File given a file
    object leaves it open)."""

    def __init__(self, reader, underlying):
        super().__init__(reader)
        self._underlying = underlying

    def close(self):
        try:
            super().close()
        finally:
            self._underlying.close()


@dataclasses.dataclass
class _Warnings:
    """Reader counters (the attributes job.read_documents updates)."""

    long_lines: int = 0
    first_long_line: str = ""
    bad_utf8_files: dict = dataclasses.field(default_factory=dict)


def _summary_merge(a: dict, b: Mapping) -> dict:
    """Sums two summaries: numbers add (those named first_* keep the smallest), dicts
    merge, strings keep the smallest non-empty."""
    for key, value in b.items():
        if isinstance(value, Mapping):
            a[key] = _summary_merge(dict(a.get(key, {})), value)
        elif isinstance(value, str):
            mine = a.get(key, "")
            a[key] = min(v for v in (mine, value) if v) if (mine or value) else ""
        elif key.startswith("first_"):
            a[key] = min(a.get(key, value), value)
        else:
            a[key] = a.get(key, 0) + value
    return a


if beam is not None:

    class _SumSummary(beam.CombineFn):
        """Combines the counters of all stages into one dict."""

        def create_accumulator(self):
            return {}

        def add_input(self, accumulator, element):
            return _summary_merge(accumulator, element)

        def merge_accumulators(self, accumulators):
            out = {}
            for acc in accumulators:
                _summary_merge(out, acc)
            return out

        def extract_output(self, accumulator):
            return accumulator

    class _ReadDocuments(beam.DoFn):
        """(file index, path) -> (doc id, lines, raw bytes) per document, reading line by line."""

        def process(self, element):
            file_index, path = element
            warnings = _Warnings()
            count = 0
            try:
                for raw in job.read_documents([path], warnings=warnings, open_file=open_any):
                    count += 1
                    yield document_id(file_index, raw.index), raw.lines, raw.nbytes
            except InputError as e:  # keeps its one-line message through the runner
                raise ValueError(f"{_ERROR_MARK}{e}") from None
            yield beam.pvalue.TaggedOutput("summary", {"warnings": dataclasses.asdict(warnings),
                                                       "documents_read": count})

    class _Tokenize(beam.DoFn):
        """Batches of raw documents -> (doc id, (tokens int32 [T], sentence splits, bytes))."""

        def __init__(self, vocab: Sequence[str], tokenizer):
            self._vocab = list(vocab)
            self._tokenizer_config = tokenizer
            self._tokenize = None

        def setup(self):
            import tensorflow as tf  # pylint: disable=g-import-not-at-top
            from data_prep.tokenization import BertTokenizer  # pylint: disable=g-import-not-at-top
            job.limit_tf_threads(tf)
            # The vocabulary travels with the DoFn: workers cannot see the launcher's files.
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, files.VOCAB_FILE)
                with open(path, "w", encoding="utf-8") as f:
                    f.write("\n".join(self._vocab) + "\n")
                tokenizer = BertTokenizer.from_config(path, self._tokenizer_config)
            graph = tf.function(tokenizer.__call__, autograph=False,
                                input_signature=[tf.TensorSpec([None], tf.string)])
            self._tokenize = lambda lines: job.ragged_to_numpy(
                graph(tf.constant(lines)))

        def process(self, batch):
            raws = [job.RawDocument(doc_id, lines, nbytes) for doc_id, lines, nbytes in batch]
            empty = 0
            for doc, nbytes in job.tokenize_documents(raws, self._tokenize):
                if doc.num_sentences:
                    yield doc.doc_id, (doc.tokens, doc.splits, nbytes)
                else:
                    empty += 1
            yield beam.pvalue.TaggedOutput("summary", {"documents_tokenized": len(raws),
                                                       "documents_without_tokens": empty})

    class _MakeInstances(beam.DoFn):
        """(bucket, documents) -> serialized tf.train.Examples, plus a summary of counters."""

        def __init__(self, config: pi.InstanceConfig, special: pi.SpecialTokens, seed: int,
                     single_document: str | None = None):
            """single_document: the line for a bucket of one document where that bucket is
            the whole corpus (one bucket): the local tool's, naming the input files."""
            self._config, self._special, self._seed = config, special, seed
            self._single_document = single_document

        def _pool(self, docs: Iterable) -> pi.OtherDocumentPool:
            """Pass 1: the bucket's documents with the smallest hash, windowed, in id order."""
            config, seed = self._config, self._seed
            shaper = pi.OtherDocumentPool(2, config.window_tokens)
            heap: list = []  # (-priority, doc_id, Document): a max-heap of the smallest
            for doc_id, (tokens, splits, _) in docs:
                item = (-_hash64("pool", seed, doc_id), doc_id)
                if len(heap) >= config.pool_size and item < heap[0][:2]:
                    continue
                doc = shaper._window(  # pylint: disable=protected-access
                    pi.Document(doc_id, tokens, splits), document_rng(seed, "window", doc_id))
                entry = item + (doc,)
                if len(heap) < config.pool_size:
                    heapq.heappush(heap, entry)
                else:
                    heapq.heapreplace(heap, entry)
            chosen = sorted(heap, key=lambda e: e[1])
            pool = pi.OtherDocumentPool(max(2, len(chosen)), config.window_tokens)
            for _, doc_id, doc in chosen:
                pool.add(doc, None)  # already windowed: no random draw
            return pool

        def process(self, element):
            bucket, docs = element
            config, special, seed = self._config, self._special, self._seed
            # Id order makes the batches below (and so the masking draws) independent of the
            # order the runner delivers the bucket in. A bucket is ~--beam_bucket_mb of text,
            # so holding it is bounded memory.
            docs = sorted(docs, key=lambda kv: kv[0])
            pool = self._pool(docs)
            stats = pi.InstanceStats()
            input_bytes = 0
            pairs: list[pi.SegmentPair] = []
            for position, (doc_id, (tokens, splits, nbytes)) in enumerate(docs):
                doc = pi.Document(doc_id, tokens, splits)
                if len(pool) < 2:
                    raise ValueError(_ERROR_MARK + (self._single_document or (
                        f"bucket {bucket} holds a single document, so its NotNext "
                        "segments have no other document to come from; the corpus needs at "
                        "least 2 documents (with several buckets, raise --beam_bucket_mb)")))
                if not pairs:
                    batch_rng = document_rng(seed, "batch", doc_id)
                rng = document_rng(seed, "instances", doc_id)
                for _ in range(config.dupe_factor):
                    pairs.extend(pi.create_pairs_from_document(
                        doc, pool, config.max_seq_length, config.short_seq_prob, rng))
                stats.documents += 1
                stats.one_sentence_documents += doc.num_sentences == 1
                stats.sentences += doc.num_sentences
                stats.tokens += doc.num_tokens
                input_bytes += nbytes
                # Whole documents per batch, cut after the one that fills it: deterministic.
                if len(pairs) >= config.batch_size or position == len(docs) - 1:
                    batch = pi.finish_instances(pairs, config, special, batch_rng, stats)
                    pairs = []
                    # --dynamic_masking: no masked_lm_* features; the trainer masks.
                    masks = ((None,) * 3 if config.dynamic_masking else
                             (batch.masked_lm_positions, batch.masked_lm_ids,
                              batch.masked_lm_weights))
                    yield from features.serialize_examples(
                        batch.input_ids, batch.input_mask, batch.segment_ids, *masks,
                        batch.next_sentence_labels)
            yield beam.pvalue.TaggedOutput(
                "summary", {"stats": dataclasses.asdict(stats), "input_bytes": input_bytes})

    class _WriteShard(beam.DoFn):
        """(shard, [(key, record)]) -> the shard, records in key order, at its temporary name."""

        def __init__(self, temp_paths: Sequence[str], gzip_compress: bool):
            self._temps, self._gzip = list(temp_paths), gzip_compress

        def process(self, element):
            shard, items = element
            items = sorted(items)
            write_tfrecords(self._temps[shard], (r for _, r in items), self._gzip)
            yield {"shard_counts": {str(shard): len(items)}}


_ERROR_MARK = "create_pretraining_data input error: "


def write_tfrecords(path: str, records: Iterable[bytes], gzip_compress: bool) -> None:
    """Writes a TFRecord file to any Beam path (TensorFlow's writer; remote: via a local copy)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    options = tf.io.TFRecordOptions(compression_type="GZIP" if gzip_compress else "")
    local = "://" not in path
    target = path if local else tempfile.mkstemp(suffix=".tfrecord")[1]
    try:
        with tf.io.TFRecordWriter(target, options) as writer:
            for record in records:
                writer.write(record)
        if not local:
            with open(target, "rb") as src, FileSystems.create(
                    path, compression_type=CompressionTypes.UNCOMPRESSED) as dst:
                shutil.copyfileobj(src, dst, 16 << 20)
    finally:
        if not local:
            os.remove(target)


# --- The pipeline. ---


def build_pipeline(pipeline, spec: job.JobSpec, vocab: Sequence[str], special: pi.SpecialTokens,
                   temp_paths: Sequence[str], summary_path: str,
                   buckets: int) -> None:
    """Adds the whole job to `pipeline` (see the module docstring)."""
    seed, num_shards = spec.random_seed, len(spec.output_files)
    read = (pipeline
            | "Files" >> beam.Create(list(enumerate(spec.input_files)))
            | "ReadDocuments" >> beam.ParDo(_ReadDocuments()).with_outputs("summary",
                                                                           main="documents"))
    tokenized = (read.documents
                 | "SpreadDocuments" >> beam.Reshuffle()
                 | "BatchDocuments" >> beam.BatchElements(min_batch_size=8, max_batch_size=256)
                 | "Tokenize" >> beam.ParDo(_Tokenize(vocab, spec.tokenizer)).with_outputs(
                     "summary", main="documents"))
    docs = tokenized.documents
    made = (docs
            | "KeyByBucket" >> beam.Map(lambda kv: (bucket_of(seed, kv[0], buckets), kv))
            | "GroupBuckets" >> beam.GroupByKey()
            | "MakeInstances" >> beam.ParDo(_MakeInstances(
                spec.config, special, seed,
                str(job.single_document_error(spec.input_files)) if buckets == 1 else None))
            .with_outputs("summary", main="records"))
    written = (made.records
               | "KeyByRecordHash" >> beam.Map(
                   lambda r: (lambda k: (k % num_shards, (k, r)))(_record_key(seed, r)))
               | "GroupShards" >> beam.GroupByKey()
               | "WriteShards" >> beam.ParDo(_WriteShard(temp_paths, spec.gzip)))
    _ = ((read.summary, tokenized.summary, made.summary, written)
         | "AllCounters" >> beam.Flatten()
         | "Summary" >> beam.CombineGlobally(_SumSummary())
         | "WriteSummary" >> beam.Map(_write_text, summary_path))


def _write_text(obj: Any, path: str) -> None:
    with FileSystems.create(path, mime_type="application/json",
                            compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(json.dumps(obj, indent=1, sort_keys=True).encode())


def _read_text(path: str) -> str:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read().decode()


def _exists(path: str) -> bool:
    return FileSystems.exists(path)


def _delete(path: str) -> None:
    """Deletes one file on any Beam file system. Beam's delete matches its paths as globs
    (local and GCS alike): a local file is removed by name, another escaped, so that
    "run [1]/x" is that file (before, nothing matched and a finished job left its temporary
    summary behind)."""
    import glob

    if "://" not in path:
        os.remove(path)
        return
    with _escaped_globs_quiet():
        FileSystems.delete([glob.escape(path)])


def _delete_quietly(paths: Iterable[str]) -> None:
    for path in paths:
        try:
            if FileSystems.exists(path):
                _delete(path)
        except Exception:  # pylint: disable=broad-except
            pass


def _job_error(e: BaseException) -> str:
    """The one line a worker's error boils down to (runners wrap it in long tracebacks)."""
    text = str(e)
    if files.write_failure(e) is not None:  # a shard that could not be written: its file
        from data_prep import cli

        return cli.describe_error(e)
    at = text.rfind(_ERROR_MARK)
    if at >= 0:
        line = text[at + len(_ERROR_MARK):].split("\n", 1)[0]
        return re.sub(r" \[while running '[^']*'\]", "", line).strip(" '\"")
    last = [line for line in text.strip().splitlines() if line.strip()]
    return f"the Beam job failed: {type(e).__name__}: {last[-1] if last else ''}"[:2000]


@contextlib.contextmanager
def _escaped_globs_quiet():
    """Around Beam's match and delete of escaped globs. Beam turns a glob into a regular
    expression, where the escaped "[[]" of a literal "[" (glob.escape) draws re's
    FutureWarning "Possible nested set": the match is right, the warning noise."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Possible nested set", FutureWarning)
        yield


def _match_sizes(pattern: str) -> dict[str, int]:
    """{path: size in bytes} of the files a user's path or glob names (`files.glob_as_written`:
    "run [1]/a.txt" is that file). Local ones through Python's glob, as the local tool finds
    them: Beam's local match walks from the directory before the first glob character without
    following links, so it found nothing in "run [[]1]/data -> /shared/corpus/"; others
    through Beam's match, on any Beam file system."""
    import glob

    if "://" not in pattern:
        found = glob.glob(files.glob_as_written(pattern))
        # A pipe (<(zcat corpus.gz)) gives its bytes once, and Beam's workers read each
        # file by its name: refused, where skipped it said "matches no data file".
        pipe = next((path for path in found if files.is_pipe(path)), None)
        if pipe is not None:
            raise PipeInputError(files.pipe_refusal(pipe))
        return {path: os.path.getsize(path) for path in found if os.path.isfile(path)}
    with _escaped_globs_quiet():
        matched = FileSystems.match([files.glob_as_written(pattern, _exists)])[0]
    return {m.path: m.size_in_bytes for m in matched.metadata_list}


def _input_bytes(paths: Sequence[str]) -> int:
    """The total size of the files `paths`, each matched as written (Beam's match read "[1]"
    in a path as a character class, and counted 0 bytes for "run [1]/a.txt")."""
    return sum(sum(_match_sizes(path).values()) for path in paths)


def _match(pattern: str) -> list[str]:
    """The matches of a glob made by the code (escaped where it names a path, as
    `files.shard_set_glob`) on any Beam file system; local ones through Python's glob (see
    `_match_sizes`)."""
    import glob

    if "://" not in pattern:
        return glob.glob(pattern)
    with _escaped_globs_quiet():
        return [m.path for m in FileSystems.match([pattern])[0].metadata_list]


def check_outputs(spec: job.JobSpec) -> list[str]:
    """Refuses existing outputs and other shard sets of the prefix (unless --overwrite) on
    any Beam file system (`pretraining_job.check_outputs`); returns the local directories it
    created (taken back if the job fails)."""
    return job.check_outputs(spec, exists=_exists, glob=_match)


def run(spec: job.JobSpec, options, bucket_mb: float = 4.0,
        log: Callable[..., None] | None = None,
        warn: Callable[..., None] | None = None) -> dict:
    """Runs the Beam job and, when it has succeeded, checks and publishes its shards.

    Args:
      spec: the job (create_pretraining_data.spec_from_flags; num_workers and
        shuffle_buffer_size are not used: the runner has its workers, the shuffle is global).
      options: Beam PipelineOptions (pipeline_options()).
      bucket_mb: text per NotNext bucket, in MB (see the module docstring).
      log: printf-style logger for progress and the summary (default: absl logging.info).
      warn: printf-style logger for the corpus warnings (`pretraining_job.check_totals`;
        default: absl logging.warning), as the local tool's run().

    Returns:
      Summary dict (totals, per-shard counts, seconds, MB/s), like the local tool's run().

    Raises:
      InputError: bad settings or input, or a failed job; no file is left under a final name.
    """
    log = log or logging.info
    warn = warn or logging.warning
    _require_beam(str(options.get_all_options().get("runner")))
    if not bucket_mb > 0:
        raise InputError(f"--beam_bucket_mb must be > 0; received {bucket_mb}")
    vocab = schema.load_vocab(spec.vocab_file)
    try:
        special = pi.SpecialTokens.from_vocab(vocab)
    except ValueError as e:
        raise InputError(f"--vocab_file {spec.vocab_file}: {e}") from None
    created = check_outputs(spec)
    pid = os.getpid()
    temps = [files.temp_path(p, pid) for p in spec.output_files]
    summary_path = files.temp_path(spec.output_files[0] + _SUMMARY_SUFFIX, pid)
    for path in spec.output_files:
        if "://" not in path:
            files.remove_stale_temps(path)
            files.remove_stale_temps(path + _SUMMARY_SUFFIX)
    start = time.monotonic()
    try:
        pipeline = beam.Pipeline(options=options)
        input_bytes = _input_bytes(spec.input_files)
        buckets = num_buckets(input_bytes, bucket_mb)
        build_pipeline(pipeline, spec, vocab, special, temps, summary_path, buckets)
        beam_log = _pylogging.getLogger("apache_beam")
        # A worker's failure is also logged by the runner with its traceback (ERROR, from
        # bundle_processor) before it is raised here, where it becomes one line; the
        # traceback shows with BERT_KERAS_DEBUG=1.
        quiet = _pylogging.WARNING if os.environ.get(DEBUG_ENV) else _pylogging.CRITICAL
        level = beam_log.level
        beam_log.setLevel(quiet)
        try:
            state = pipeline.run().wait_until_finish()
        except Exception as e:  # pylint: disable=broad-except
            raise InputError(_job_error(e)) from None
        finally:
            beam_log.setLevel(level or _pylogging.WARNING)
        if state is not None and str(state).upper().rsplit(".", 1)[-1] != "DONE":
            raise InputError(f"the Beam job ended in state {state}; no output was published")
        summary = json.loads(_read_text(summary_path))
        result = _publish(spec, temps, summary, options, {"bucket_mb": bucket_mb,
                                                           "buckets": buckets}, log, warn)
    except BaseException:
        _delete_quietly(temps + [summary_path])
        files.remove_created_dirs(created)
        raise
    _delete_quietly([summary_path])
    seconds = time.monotonic() - start
    totals = result["totals"]
    mb = result["input_bytes"] / 1e6
    log("wrote %s instances from %s documents (%.1f MB of text) to %d shard(s) in %.1f s "
        "(%.2f MB/s); NotNext %.1f%%, masked %.2f%% of real tokens",
        f"{totals['instances']:,}", f"{totals['documents']:,}", mb, len(spec.output_files),
        seconds, mb / max(seconds, 1e-9),
        100.0 * totals["not_next"] / max(totals["instances"], 1),
        100.0 * totals["masked"] / max(totals["real_tokens"], 1))
    for path in spec.output_files:
        log("  %s", path)
    return dict(result, seconds=seconds, mb_per_second=mb / max(seconds, 1e-9))


def _publish(spec: job.JobSpec, temps: Sequence[str], summary: Mapping, options,
             beam_meta: dict, log: Callable[..., None], warn: Callable[..., None]) -> dict:
    """Checks the job's shards against its counters, writes sidecars, renames into place."""
    totals = pi.InstanceStats(**summary.get("stats", {}))
    warnings = summary.get("warnings", {})
    reader = job.WorkerResult(worker=0, stats=totals, input_bytes=summary.get("input_bytes", 0),
                              shard_counts={}, long_lines=warnings.get("long_lines", 0),
                              first_long_line=warnings.get("first_long_line", ""),
                              bad_utf8_files=warnings.get("bad_utf8_files", {}))
    # Every document read must reach instance creation: a runner that drops data fails here.
    read_count = summary.get("documents_read", 0)
    for stage, count in (("tokenized", summary.get("documents_tokenized", 0)),
                         ("turned into instances", totals.documents +
                          summary.get("documents_without_tokens", 0))):
        if count != read_count:
            raise InputError(f"the Beam job read {read_count} documents but {count} were "
                             f"{stage}: the runner lost data; no output was published")
    if totals.documents == 0:
        raise job.no_document_error(spec.input_files)
    job.check_totals(totals, [reader], spec, warn)
    counts = {int(k): v for k, v in summary.get("shard_counts", {}).items()}
    for j, temp in enumerate(temps):
        if j not in counts:  # no record hashed to this shard: an empty, valid file
            write_tfrecords(temp, [], spec.gzip)
            counts[j] = 0
    if sum(counts.values()) != totals.instances:
        raise InputError(f"the job wrote {sum(counts.values())} records but made "
                         f"{totals.instances} instances; no output was published")
    compression = "GZIP" if spec.gzip else ""
    for j, temp in enumerate(temps):
        try:
            features.check_shard(temp, {"shard": {"instances": counts[j]}}, compression)
        except features.DamagedDataError as e:
            raise InputError(f"{e}; no output was published") from None
    common = job.sidecar_common(
        spec, totals, reader.input_bytes, files.sha256_file(spec.vocab_file))
    runner = str(options.get_all_options().get("runner"))
    common["beam"] = dict(beam_meta, runner=runner, pool_size=spec.config.pool_size)
    if not spec.overwrite:
        check_outputs(spec)  # nothing appeared meanwhile
    replaced = (job.other_shard_sets(spec.output_files, _match, _exists) if spec.overwrite
                else [])
    metas = [dict(common, shard={"index": j, "num_shards": len(temps), "instances": counts[j]})
             for j in range(len(temps))]
    if not any("://" in path for path in spec.output_files):
        job.publish_shards(temps, spec.output_files, metas, spec.overwrite, replaced)
    else:  # another file system (gs://, s3://, ...): Beam's own calls, one shard at a time
        for temp, path, meta in zip(temps, spec.output_files, metas):
            _write_text(meta, features.sidecar_path(path))
            if _exists(path):
                _delete(path)
            FileSystems.rename([temp], [path])
        _delete_quietly(replaced)  # once the new set is in place, as publish_shards does
    if replaced:
        log("--overwrite: removed the prefix's other outputs, %s",
            job.describe_shard_sets(replaced))
    return {"totals": dataclasses.asdict(totals), "input_bytes": reader.input_bytes,
            "shard_counts": [counts[j] for j in range(len(temps))]}


__all__ = ["RUNNERS", "build_pipeline", "check_outputs", "document_rng", "expand_input_files",
           "parse_pipeline_options", "pipeline_options", "run", "write_tfrecords"]
