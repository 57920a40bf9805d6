"""What both pretraining-data producers share: the job, reading, tokenizing and the checks.

The local tool (data_prep/create_pretraining_data.py, N worker processes) and the Beam
pipeline (data_prep/beam_pipeline.py) run the same job: a `JobSpec` (from the tool's flags),
Google's text format read by `read_documents` (one sentence a line, a blank line between
documents; binary files and overlong lines refused), whole documents tokenized in batches
(`tokenize_documents`), the corpus-level checks (`check_totals`), the sidecar every shard
gets (`sidecar_common`), and the outputs: their checks (`check_outputs`, which refuses
another shard set of the same prefix) and publishing (`publish_shards`). Both import this
module; neither imports the other's internals (the tool hands a Beam --runner to
beam_pipeline, which needs nothing of the tool).
"""

from __future__ import annotations

import dataclasses
import json
import os
import zlib
from typing import BinaryIO, Callable, Iterable, Iterator, Sequence

import numpy as np

from data_prep import features, files, schema
from data_prep import pretraining_instances as pi
from data_prep.cli import ToolError
from data_prep.tokenizer_config import TokenizerConfig

# A line longer than this is not a sentence; refusing it keeps memory bounded.
MAX_LINE_BYTES = 8 * 1024 * 1024
LONG_LINE_WARN_BYTES = 10_000
_TOKENIZE_BATCH_LINES = 2048
_TOKENIZE_BATCH_BYTES = 512 * 1024


class InputError(ToolError):
    """Bad input or settings; the message says which file or flag and what was expected."""


class CorpusError(InputError):
    """The corpus as a whole is unusable (no document, a single one): every worker finds
    it, and the job reports it once, as one worker would, without a worker's number."""


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """Everything a run needs (picklable: it travels to spawned workers).

    Attributes:
      input_files: expanded input paths, in reading order.
      output_files: final shard paths.
      temp_files: where each shard is written until the whole run succeeds.
      vocab_file: the WordPiece vocabulary.
      tokenizer: its settings (saved beside the vocabulary, then flags).
      tokenizer_source: the tokenizer_config.json they came from, or None.
      config: instance-creation settings.
      random_seed: base seed; worker w uses (random_seed, w).
      num_workers: processes (1 = run in this process).
      gzip: GZIP-compress the shards.
      shuffle_buffer_size: instances held per worker for output shuffling.
      num_examples_to_print: first instances logged decoded.
      print_full_examples: log them in Google's full layout instead of compactly.
      overwrite: replace existing outputs.
      flag_values: flags recorded in the sidecars.
    """

    input_files: tuple[str, ...]
    output_files: tuple[str, ...]
    vocab_file: str
    tokenizer: TokenizerConfig
    config: pi.InstanceConfig
    temp_files: tuple[str, ...] = ()
    tokenizer_source: str | None = None
    random_seed: int = 12345
    num_workers: int = 1
    gzip: bool = False
    shuffle_buffer_size: int = 50_000
    num_examples_to_print: int = 1
    print_full_examples: bool = False
    overwrite: bool = False
    flag_values: tuple[tuple[str, object], ...] = ()


@dataclasses.dataclass
class WorkerResult:
    """What a worker reports back: counters and instances per shard it wrote."""

    worker: int
    stats: pi.InstanceStats
    input_bytes: int
    shard_counts: dict[int, int]
    long_lines: int = 0
    first_long_line: str = ""
    # Documents in the whole corpus, every worker's (read_documents counts the others' too,
    # without decoding them): tells a short corpus from a short share.
    corpus_documents: int = 0
    # path -> {"bad": lines with bytes that are not UTF-8, "lines": the lines decoded,
    # "first_line": the first such line}, for the files that have any (note_bad_utf8).
    bad_utf8_files: dict = dataclasses.field(default_factory=dict)
    setup_seconds: float = 0.0  # TensorFlow import and tokenizer construction (wall)
    work_seconds: float = 0.0  # reading to last record written (wall)
    work_cpu_seconds: float = 0.0  # the same span in CPU time of this process, all threads


# --- Reading Google's text format. ---


def _open_binary(path: str):
    return files.open_input(path, "rb")


def _sniff(path: str, open_file: Callable[[str], BinaryIO] = _open_binary) -> None:
    """Rejects files that are not UTF-8 text, or whose lines end in a lone "\\r" (read as one
    line, as Google's reader reads them), looking at their first 64 KB (read on to the
    first line end: `files.line_end_sample`)."""
    try:
        with open_file(path) as f:
            head = files.line_end_sample(f)
    except (OSError, EOFError, zlib.error) as e:  # gzip: not gzip, truncated, corrupt
        raise InputError(f"cannot read input file {path}: {e}") from None
    nul = head.find(b"\x00")
    text = head.decode("utf-8", errors="replace")
    bad = text.count("\ufffd") - head.decode("utf-8", errors="ignore").count("\ufffd")
    if nul >= 0 or head.startswith((b"\xff\xfe", b"\xfe\xff")) or (
            bad > 8 and bad > 0.01 * len(text)):
        raise InputError(f"input file {files.not_text_message(head, path)}")
    lone_cr = files.lone_cr_message(head, path)
    if lone_cr:
        raise InputError(f"input file {lone_cr}")


def note_bad_utf8(warnings, path: str, line: int) -> None:
    """Counts a line of `path` with bytes that are not UTF-8 (on a WorkerResult or the Beam
    reader's counters)."""
    counts = warnings.bad_utf8_files.setdefault(path, {"bad": 0, "lines": 0, "first_line": line})
    counts["bad"] += 1


class RawDocument:
    """One document's lines, before tokenization."""

    __slots__ = ("index", "lines", "nbytes")

    def __init__(self, index: int, lines: list[str], nbytes: int):
        self.index, self.lines, self.nbytes = index, lines, nbytes


def read_documents(input_files: Sequence[str], worker: int = 0, num_workers: int = 1,
                   warnings: WorkerResult | None = None,
                   open_file: Callable[[str], BinaryIO] = _open_binary
                   ) -> Iterator[RawDocument]:
    """Streams the documents of Google's format that belong to one worker.

    Documents are numbered across all files in order; worker w gets those with
    index % num_workers == w (other workers' documents are skipped without decoding). A
    document is decoded as a whole; a line with invalid UTF-8 loses the bad bytes (counted).

    Args:
      input_files: paths (.gz read decompressed).
      worker, num_workers: which share to return.
      warnings: optional WorkerResult whose long_lines / bad_utf8_files counters are updated,
        and corpus_documents set once the stream ends.
      open_file: path -> binary file object with readline(size) (default: local files,
        .gz decompressed; the Beam pipeline passes one for any Beam file system).

    Yields:
      RawDocument(index, lines (stripped, non-empty str), nbytes (raw bytes of its lines)).

    Raises:
      InputError: unreadable or binary file, or a line longer than MAX_LINE_BYTES.
    """
    index = 0
    for path in input_files:
        _sniff(path, open_file)
        try:
            f = open_file(path)
        except OSError as e:
            raise InputError(f"cannot read input file {path}: {e}") from None
        with f:
            readline = f.readline
            current: list[bytes] = []  # stripped lines of the document being read
            first_line = nbytes = line_no = decoded = 0  # decoded: lines of this worker's
            try:
                while True:
                    raw = readline(MAX_LINE_BYTES + 1)
                    if not raw:
                        break
                    line_no += 1
                    if len(raw) > MAX_LINE_BYTES:
                        raise InputError(
                            f"{path}:{line_no}: line longer than {MAX_LINE_BYTES} bytes; expected "
                            "one sentence per line (python -m data_prep.prepare_corpus splits raw "
                            "text)")
                    if b"\r" in raw:
                        # Google's reader (tf.io.gfile's readline) drops every "\r": "\r\n"
                        # ends a line as "\n" does, and "a\rb" reads "ab".
                        raw = raw.replace(b"\r", b"")
                    stripped = raw.strip()
                    if stripped and stripped[0] in _MAYBE_SPACE \
                            and not stripped.decode("utf-8", "replace").strip():
                        stripped = b""  # only Unicode spaces (U+00A0, U+3000, ...): blank
                    if stripped:
                        if not current:
                            first_line = line_no
                        current.append(stripped)
                        nbytes += len(raw)
                    elif current:
                        if index % num_workers == worker:
                            decoded += len(current)
                            yield _decode_document(index, current, nbytes, path, first_line,
                                                   warnings)
                        index += 1
                        current, nbytes = [], 0
            except (EOFError, OSError, zlib.error) as e:  # gzip: truncated or corrupt
                raise InputError(f"{path}:{line_no + 1}: cannot be read ({type(e).__name__}: "
                                 f"{e}); the file is damaged or truncated") from None
            if current:
                if index % num_workers == worker:
                    decoded += len(current)
                    yield _decode_document(index, current, nbytes, path, first_line, warnings)
                index += 1
        if warnings is not None and path in warnings.bad_utf8_files:
            warnings.bad_utf8_files[path]["lines"] += decoded
    if warnings is not None:
        warnings.corpus_documents = index


# The first bytes (UTF-8) of the characters str.strip() removes and bytes.strip() keeps:
# U+001C..U+001F; U+0085, U+00A0 (C2); U+1680 (E1); U+2000..U+205F (E2); U+3000 (E3). A
# line beginning with one may be blank as Google's reader sees it (it decodes each line,
# then strips it); other lines (Hangul begins with EA..ED) are not decoded twice.
_MAYBE_SPACE = frozenset((0x1C, 0x1D, 0x1E, 0x1F, 0xC2, 0xE1, 0xE2, 0xE3))


def _decode_document(index: int, lines: list[bytes], nbytes: int, path: str, first_line: int,
                     warnings: WorkerResult | None) -> RawDocument:
    """Decodes one document's stripped lines (numbered from `first_line` in `path`)."""
    joined = b"\n".join(lines)
    if b"\x00" in joined:
        bad = next(i for i, line in enumerate(lines) if b"\x00" in line)
        raise InputError(f"{path}:{first_line + bad}: NUL byte in text; the file looks binary")
    try:
        text = joined.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        text = []
        for line in lines:
            try:
                text.append(line.decode("utf-8"))
            except UnicodeDecodeError:
                text.append(line.decode("utf-8", errors="ignore"))
                if warnings is not None:
                    note_bad_utf8(warnings, path, first_line + len(text) - 1)
    if warnings is not None and max(map(len, lines)) > LONG_LINE_WARN_BYTES:
        for i, line in enumerate(lines):
            if len(line) > LONG_LINE_WARN_BYTES:
                warnings.long_lines += 1
                if not warnings.first_long_line:
                    warnings.first_long_line = f"{path}:{first_line + i} ({len(line):,} bytes)"
    return RawDocument(index, text, nbytes)


# --- Tokenization in batches. ---


def ragged_to_numpy(ids) -> tuple[np.ndarray, np.ndarray]:
    """RaggedTensor [B, (words), (pieces)] or [B, (pieces)] -> (flat int32, row_splits int64)."""
    if getattr(ids, "ragged_rank", 1) > 1:
        ids = ids.merge_dims(1, -1)
    return (np.asarray(ids.flat_values.numpy(), np.int32),
            np.asarray(ids.row_splits.numpy(), np.int64))


def tokenize_documents(raw_documents: Iterable[RawDocument],
                       tokenize: Callable[[list[str]], tuple[np.ndarray, np.ndarray]]
                       ) -> Iterator[tuple[pi.Document, int]]:
    """Tokenizes whole documents in batches of about 512 KB of text.

    Args:
      raw_documents: RawDocument stream.
      tokenize: list of N lines -> (flat int32 ids, int64 row_splits [N + 1]).

    Yields:
      (Document with empty sentences dropped, raw byte count of the document).
    """
    batch: list[RawDocument] = []
    batch_lines = batch_bytes = 0

    def flush() -> Iterator[tuple[pi.Document, int]]:
        lines = [line for doc in batch for line in doc.lines]
        flat, splits = tokenize(lines)
        splits = splits.tolist()
        row = 0
        for doc in batch:
            starts = splits[row:row + len(doc.lines) + 1]
            lo = starts[0]
            bounds = [0]
            for s in starts[1:]:
                if s - lo > bounds[-1]:  # a sentence without tokens is dropped
                    bounds.append(s - lo)
            # Empty sentences hold no tokens, so the document is one contiguous run.
            tokens = np.array(flat[lo:starts[-1]], np.int32)  # a copy: the batch can go
            yield pi.Document(doc.index, tokens, bounds), doc.nbytes
            row += len(doc.lines)

    for doc in raw_documents:
        batch.append(doc)
        batch_lines += len(doc.lines)
        batch_bytes += doc.nbytes
        if batch_lines >= _TOKENIZE_BATCH_LINES or batch_bytes >= _TOKENIZE_BATCH_BYTES:
            yield from flush()
            batch, batch_lines, batch_bytes = [], 0, 0
    if batch:
        yield from flush()


# --- Outputs: the checks before and after the job, and publishing. ---


def _same_path(path: str) -> str:
    return files.absolute(path)


def other_shard_sets(output_files: Sequence[str],
                     glob: Callable[[str], Iterable[str]] = files.glob_files,
                     exists: Callable[[str], bool] = files.exists) -> list[str]:
    """The existing files of other outputs of the outputs' prefixes, sidecars included.

    A prefix (`files.output_prefix`) is written either as shards
    `<prefix>-NNNNN-of-MMMMM.tfrecord[.gz]` (--num_output_shards, or Beam's automatic
    count) or as one file `<prefix>`, `<prefix>.tfrecord` or `<prefix>.tfrecord.gz`.
    Another set of shards (another count or compression), the single file beside shards, or
    shards beside the single file: a later glob of the prefix (`<prefix>-*.tfrecord`, as
    documented, or `<prefix>*`) would read both, the corpus twice.

    Args:
      output_files: the job's final paths.
      glob: pattern -> matching paths (Beam passes one for every Beam file system).
      exists: whether a path exists (a local directory is no output); Beam passes its own.
    """
    ours = {_same_path(p) for out in output_files for p in (out, features.sidecar_path(out))}
    prefixes = {files.output_prefix(out) for out in output_files}
    others = set()
    for prefix in sorted(prefixes):
        for path in glob(files.shard_set_glob(prefix)):
            found = files.shard_set_of(path)
            if (found and _same_path(found[0]) == _same_path(prefix)
                    and _same_path(path) not in ours):
                others.add(path)
        for suffix in files.SINGLE_OUTPUT_SUFFIXES:
            for path in (prefix + suffix, features.sidecar_path(prefix + suffix)):
                if (_same_path(path) not in ours and exists(path)
                        and ("://" in path or not os.path.isdir(path))):
                    others.add(path)
    return sorted(others)


def describe_shard_sets(paths: Iterable[str], counts: bool = True) -> str:
    """`x-*-of-00002.tfrecord (4 files, sidecars included)` for each set among `paths`, and
    `x.tfrecord (2 files, sidecar included)` for a single output, joined by "and" (without
    the parenthesis when not `counts`)."""
    sets: dict[str, int] = {}
    for path in paths:
        found = files.shard_set_of(path)
        if found:
            name = files.describe_shard_set(*found)
        else:
            name = path[:-len(files.SIDECAR_SUFFIX)] if path.endswith(
                files.SIDECAR_SUFFIX) else path
        sets[name] = sets.get(name, 0) + 1
    return " and ".join(
        name + (f" ({n} file{'s' if n != 1 else ''}, sidecar{'s' if n > 2 else ''} "
                "included)" if counts else "")
        for name, n in sorted(sets.items()))


def check_outputs(spec: JobSpec, exists: Callable[[str], bool] = files.exists,
                  glob: Callable[[str], Iterable[str]] = files.glob_files) -> list[str]:
    """Refuses to overwrite existing outputs (unless spec.overwrite) and creates directories.

    Besides this job's own names, other shard sets of its output prefix are refused (another
    --num_output_shards, worker count or --gzip_compress before): `<prefix>-*.tfrecord`
    would read both. With --overwrite, `publish_shards` removes them once the new set is in
    place.

    Args:
      spec: the job (its output_files and overwrite are read).
      exists, glob: file-system calls (Beam passes its own, for gs:// and the like).

    Returns:
      The local directories it created (`files.remove_created_dirs` takes them back on
      failure).

    Raises:
      InputError: naming the existing files, or a bad output list.
      files.OutputWriteError: a local output's place cannot be written
        (`files.check_writable`).
    """
    if not spec.output_files:
        raise InputError("--output_file names no file")
    if len(set(spec.output_files)) != len(spec.output_files):
        raise InputError(f"--output_file names a file twice: {list(spec.output_files)}")
    finals = [p for out in spec.output_files for p in (out, features.sidecar_path(out))]
    directories = [p for p in finals if "://" not in p and os.path.isdir(p)]
    if directories:  # even with --overwrite: found after the whole job, naming a temp file
        raise InputError(f"--output_file: {directories[0]} is a directory; name a file (or a "
                         "prefix) in it")
    for out in finals:  # even with --overwrite, which replaces earlier outputs only
        files.refuse_an_input(out, "--output_file", spec.input_files, "--input_file")
    if not spec.overwrite:
        existing = [p for p in finals if exists(p)]
        if existing:
            raise InputError(f"refusing to overwrite {len(existing)} existing output file(s), "
                             f"e.g. {existing[0]}; pass --overwrite to replace them")
        others = other_shard_sets(spec.output_files, glob, exists)
        if others:
            prefix = files.output_prefix(others[0])
            single = any(not files.shard_set_of(p) for p in others + list(spec.output_files))
            raise InputError(
                f"--output_file: {prefix} already has "
                f"{'another output' if single else 'another shard set'}, "
                f"{describe_shard_sets(others)}, which a glob such as "
                f"{prefix}{'*' if single else '-*'} would read beside this run's "
                f"{describe_shard_sets(spec.output_files, False)} (the corpus twice); pass "
                "--overwrite to replace the prefix's "
                f"{'outputs' if single else 'shards'}, or choose another --output_file")
    # An unwritable place is refused here, not when the workers (or a Beam job, at its end)
    # open the shards.
    files.check_writable(spec.output_files)
    return files.make_parent_dirs([out for out in spec.output_files if "://" not in out])


def publish_shards(temps: Sequence[str], finals: Sequence[str], metas: Sequence[dict],
                   overwrite: bool, replaced: Iterable[str] = ()) -> None:
    """Renames a job's finished shards into place with their sidecars, as one set.

    The sidecars are written under temporary names first, so that publishing is renames
    only; with `overwrite` the outputs being replaced are removed before (an interrupted
    publish never leaves an old set mixed with a new one); an interruption (Ctrl-C, an
    error) while renaming removes what was renamed: a complete set or nothing. Before, a
    Ctrl-C there left the first shards, and run_pretraining trained on 1 of 4 without a
    word. `replaced` (`other_shard_sets`, with --overwrite) is removed only once the whole
    new set is in place: a failed run loses no data, and an interruption between leaves two
    sets, which run_pretraining refuses.
    """
    sidecar_temps = []
    try:
        for final, meta in zip(finals, metas):
            sidecar_temps.append(files.temp_path(features.sidecar_path(final)))
            # The local tool writes a remote (gs://) output's shards there directly
            # (TensorFlow's TFRecordWriter); its sidecars go the same way.
            if files.is_remote(final):
                import tensorflow as tf

                opened = tf.io.gfile.GFile(sidecar_temps[-1], "w")
            else:
                opened = open(sidecar_temps[-1], "w", encoding="utf-8")
            with opened as f:
                f.write(json.dumps(meta, indent=2, sort_keys=True, allow_nan=False,
                                   ensure_ascii=False) + "\n")
    except BaseException:
        remove_files(sidecar_temps)
        raise
    published: list[str] = []
    try:
        if overwrite:
            remove_files([p for final in finals for p in (final, features.sidecar_path(final))])
        for temp, sidecar_temp, final in zip(temps, sidecar_temps, finals):
            files.replace(sidecar_temp, features.sidecar_path(final))
            published.append(features.sidecar_path(final))
            files.replace(temp, final)
            published.append(final)
    except BaseException:
        remove_files(published + sidecar_temps)
        raise
    remove_files(replaced)


def remove_files(paths: Iterable[str]) -> None:
    for path in paths:
        try:
            files.remove(path)
        except OSError:
            pass


def limit_tf_threads(tf) -> None:
    """One thread per worker process, so that --num_workers means cores used."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:  # TensorFlow already initialized in this process (e.g. in tests)
        pass


# check_totals warns when more of the corpus's WordPieces than this are [UNK]: a vocabulary
# learnt on the same kind of text leaves well under 1% (BUILD_NOTES 4.2: 0.03% in domain,
# 6-9% on other Korean text); the wrong casing flags for Korean, nearly 100%.
UNKNOWN_WARN_SHARE = 0.05
# A file in which more of the lines than this have bytes that are not UTF-8 was saved in
# another encoding (a cp949 part of a concatenated corpus): refused, where a stray bad byte
# is dropped with a warning as Google's reader drops it.
BAD_UTF8_REFUSE_SHARE = 0.01


def _corpus_error(input_files: Sequence[str], one: str, many: str) -> CorpusError:
    """A CorpusError naming the corpus: its file (`one` follows its name), or its files,
    the first three of a longer list (`many` follows them)."""
    if len(input_files) == 1:
        return CorpusError(f"{input_files[0]}: {one}")
    shown = ", ".join(input_files[:3]) + (
        f" and {len(input_files) - 3} more" if len(input_files) > 3 else "")
    return CorpusError(f"--input_file: its {len(input_files)} files ({shown}) {many}")


_EXPECTED_LAYOUT = "expected one sentence per line, a blank line between documents"


def no_document_error(input_files: Sequence[str]) -> CorpusError:
    """The corpus holds no document with text (blank lines only, or a compressed file of
    nothing, which the up-front check of empty files does not see)."""
    return _corpus_error(input_files, f"no document with text in it ({_EXPECTED_LAYOUT})",
                         f"hold no document with text ({_EXPECTED_LAYOUT})")


def single_document_error(input_files: Sequence[str]) -> CorpusError:
    """The corpus holds one document. Google's tool would draw its "random" NotNext
    segments from that document itself (ten tries at another index, then it keeps the same
    one): NotNext labels on text that follows on."""
    why = ("NotNext segments come from another document, so at least 2 are needed "
           f"({_EXPECTED_LAYOUT})")
    return _corpus_error(input_files, f"a single document (no blank line in it); {why}",
                         f"hold a single document; {why}")


def check_totals(totals: pi.InstanceStats, results: Sequence[WorkerResult], spec: JobSpec,
                  warn: Callable[..., None]) -> None:
    """Refuses a corpus the job should not have been run on (bad UTF-8 above
    BAD_UTF8_REFUSE_SHARE, every document a single sentence); warns, through the
    printf-style `warn` (absl logging.warning in the tools), about what it was run on anyway.

    Raises:
      InputError: the corpus is refused; nothing was published.
    """
    long_lines = sum(r.long_lines for r in results)
    if long_lines:
        first = next(r.first_long_line for r in results if r.first_long_line)
        warn("%d line(s) longer than %d bytes, first at %s; input should hold one "
             "sentence per line (python -m data_prep.prepare_corpus splits raw text)",
             long_lines, LONG_LINE_WARN_BYTES, first)
    bad_files: dict[str, dict[str, int]] = {}
    for r in results:
        for path, counts in r.bad_utf8_files.items():
            merged = bad_files.setdefault(path, {"bad": 0, "lines": 0,
                                                 "first_line": counts["first_line"]})
            merged["bad"] += counts["bad"]
            merged["lines"] += counts["lines"]
            merged["first_line"] = min(merged["first_line"], counts["first_line"])
    for path, counts in sorted(bad_files.items()):
        if counts["bad"] > BAD_UTF8_REFUSE_SHARE * counts["lines"]:
            raise InputError(
                f"{path}: {counts['bad']:,} of its {counts['lines']:,} non-blank lines "
                f"{'is' if counts['bad'] == 1 else 'are'} not UTF-8 (the first: line "
                f"{counts['first_line']}); expected UTF-8 text: convert it from "
                "the encoding it was saved in (e.g. iconv -f cp949 -t utf-8 for Korean Windows "
                "text), or drop the bad bytes (iconv -c -f utf-8 -t utf-8); nothing was written")
    if bad_files:
        path, counts = min(bad_files.items())
        warn("%d line(s) had bytes that are not UTF-8, which were dropped (first at "
             "%s:%d)", sum(c["bad"] for c in bad_files.values()), path, counts["first_line"])
    if totals.documents and totals.one_sentence_documents == totals.documents:
        raise InputError(
            f"all {totals.documents} documents hold a single sentence, so every instance would "
            "be NotNext; expected one sentence per line with a blank line between documents "
            "(python -m data_prep.prepare_corpus makes that from raw text)")
    if totals.unknown_tokens > UNKNOWN_WARN_SHARE * totals.tokens:
        settings = spec.tokenizer
        warn("%.1f%% of the corpus's %d WordPieces are [UNK]: is %s the vocabulary for "
             "this text, and %s its tokenizer settings? (Korean: do_lower_case with "
             "strip_accents=false, or every Hangul word is [UNK]; build_vocab writes them as "
             "tokenizer_config.json beside its vocab.txt)", 100.0 * totals.unknown_tokens /
             totals.tokens, totals.tokens, spec.vocab_file, settings.describe())
    if totals.one_sentence_documents * 2 > totals.documents:
        warn("%d of %d documents hold a single sentence; their instances are all "
             "NotNext (NotNext share %.1f%%)", totals.one_sentence_documents, totals.documents,
             100.0 * totals.not_next / max(totals.instances, 1))


def sidecar_common(spec: JobSpec, totals: pi.InstanceStats, input_bytes: int,
                    vocab_sha: str) -> dict:
    dynamic = spec.config.dynamic_masking
    predictions = None if dynamic else spec.config.max_predictions_per_seq
    spec_lengths = features.feature_spec(spec.config.max_seq_length, predictions)
    return {
        "format": features.SIDECAR_FORMAT,
        "created_by": "data_prep.create_pretraining_data",
        "max_seq_length": spec.config.max_seq_length,
        "max_predictions_per_seq": predictions,
        # "dynamic": no masked_lm_* features; the trainer masks on every pass.
        "masking": features.DYNAMIC_MASKING if dynamic else features.STATIC_MASKING,
        "features": {name: {"dtype": f.dtype.name, "length": int(f.shape[0])}
                     for name, f in spec_lengths.items()},
        "compression": "GZIP" if spec.gzip else "",
        "vocab_file": _same_path(spec.vocab_file),
        "vocab_sha256": vocab_sha,
        # Its tokens: the trainer refuses a model whose embedding table has fewer rows.
        "vocab_size": len(schema.load_vocab(spec.vocab_file)),
        # The tokenizer settings, for the trainer and every later stage: top-level keys as
        # before, plus the full tokenizer_config.json content.
        "do_lower_case": spec.tokenizer.do_lower_case,
        "strip_accents": spec.tokenizer.effective_strip_accents,
        "tokenize_chinese_chars": spec.tokenizer.tokenize_chinese_chars,
        "tokenizer": spec.tokenizer.to_json_dict(),
        "tokenizer_source": spec.tokenizer_source,
        "counts": dict(dataclasses.asdict(totals), input_bytes=input_bytes),
        "num_input_files": len(spec.input_files),
        "input_files": list(spec.input_files[:100]),
        "flags": dict(spec.flag_values),
    }
