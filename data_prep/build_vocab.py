r"""Learns a WordPiece vocabulary from text files.

    python -m data_prep.build_vocab --input=corpus/*.txt --output=vocab.txt \
        --vocab_size=30522 --layout=google [--do_lower_case=false] [--strip_accents=false]

Pipeline (memory bounded: the corpus is streamed, only a word-count table is kept):

  1. Stream the files line by line (`.gz` files decompressed; a line that is not UTF-8 is
     an error naming the file, line and byte; a "\r" inside a line dropped, as
     create_pretraining_data's reader drops it), split every line into words with the *same*
     in-graph normalizer the tokenizer uses (`tokenization.BertPreTokenizer`), and count
     words. If the table exceeds --max_unique_words, the rarest words are pruned (as
     word2vec prunes its vocabulary), so counts of rare words are approximate. Words
     longer than 100 characters are skipped: the tokenizer turns them into [UNK] whatever
     the vocabulary.
  2. Train Hugging Face `tokenizers`' WordPieceTrainer (BPE merges with "##" continuation
     pieces, written in Rust) on the counts. Every character of a word of two or more
     characters is kept in both forms, as a word start and as a "##" piece, so
     re-tokenizing the corpus yields no [UNK], nor does new text whose characters the
     corpus had in words, wherever in the word (the trainer alone gives "##x" only to
     characters it saw inside words: a Korean syllable seen only word-initially made every
     word holding it further in [UNK] whole; BUILD_NOTES 4.2 measures the difference).
     Characters the tokenizer always splits off as words of their own (punctuation,
     Chinese characters) get no "##" piece, which could never be used. Every printable
     ASCII character (letters lowercased with --do_lower_case, digits, punctuation) is kept
     too, seen in the corpus or not (--ascii_alphabet, default on), as in Google's
     vocabularies: a Korean corpus without "<" or "q" still gives a vocabulary in which
     later text's markup, code, English words and KLUE-RE's entity markers are not [UNK].
     Every "##x" piece
     is declared up front so that the trainer's tie-breaking (by internal ids, otherwise
     numbered in hash-map order) is the same in every run.
     BUILD_NOTES.md compares it with tensorflow-text's and keras-hub's learners.
  3. Lay out the special tokens:
       google:  [PAD]=0, [unused0]..[unused98]=1..99, [UNK]=100, [CLS]=101, [SEP]=102,
                [MASK]=103, [unused99].. (--num_unused in total, Google: 994), learned tokens
       compact: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4, [unused0].. (--num_unused,
                default 0), learned tokens
     The file has exactly --vocab_size lines; it is written under a temporary name and
     renamed, and an existing file is only replaced with --overwrite.
  4. Write the tokenizer settings beside it (tokenizer_config.json, Hugging Face's keys;
     see data_prep/tokenizer_config.py): create_pretraining_data, the trainers and the
     exports read them from there, so --strip_accents=false (Korean) is given once, here.

The output is a deterministic function of the input bytes and the flags.
"""

from __future__ import annotations

import collections
import glob
import os
import time
import zlib
from typing import Callable, Iterable, Iterator, Sequence

from absl import app, flags, logging

from data_prep import files, schema, tokenization, tokenizer_config
from data_prep.tokenizer_config import TokenizerConfig

LAYOUTS = ("google", "compact")
GOOGLE_NUM_UNUSED = 994  # bert-base-uncased: [unused0]..[unused993]

_INPUT = flags.DEFINE_list("input", None, "Comma-separated text files or glob patterns.")
_OUTPUT = flags.DEFINE_string("output", None, "Path of the vocabulary file to write.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", None, "Exact number of lines of the vocabulary.")
_LAYOUT = flags.DEFINE_enum("layout", "google", LAYOUTS, "Special-token layout (see module doc).")
_NUM_UNUSED = flags.DEFINE_integer(
    "num_unused", None, "Number of [unusedN] tokens; default 994 for google, 0 for compact.")
# The tokenizer settings the vocabulary is learned with; written beside it as
# tokenizer_config.json, from where every later stage reads them.
_TOKENIZER_FLAGS = tokenizer_config.define_flags(creating=True)
_MIN_FREQUENCY = flags.DEFINE_integer(
    "min_frequency", 2, "Merge only pairs seen at least this often.")
_MAX_ALPHABET = flags.DEFINE_integer(
    "max_alphabet", 0, "Keep only the most frequent characters (0 = all); words with other "
    "characters are left out of training.")
_ASCII_ALPHABET = flags.DEFINE_boolean(
    "ascii_alphabet", True, "Keep every printable ASCII character (letters, lowercased with "
    "--do_lower_case; digits; punctuation) in the vocabulary whether or not the corpus has "
    "it, as Google's vocabularies do, so English words, numbers and markup in later text are "
    "never [UNK]; --noascii_alphabet keeps only the corpus's characters.")
_MAX_UNIQUE_WORDS = flags.DEFINE_integer(
    "max_unique_words", 5_000_000, "Bound on the word-count table; rarer words are pruned.")
_OVERWRITE = flags.DEFINE_boolean("overwrite", False, "Replace an existing --output file.")


class BuildVocabError(ValueError):
    """Bad arguments or a corpus that cannot give the requested vocabulary."""


class CorpusTooSmallError(BuildVocabError):
    """The corpus gives `available` WordPiece tokens, fewer than the `requested`; of its
    `words` distinct words (those trained on), `unmerged` are not yet one token each (0:
    the trainer learnt every word whole, so only new distinct words give more tokens)."""

    def __init__(self, message: str, available: int, requested: int, words: int = 0,
                 unmerged: int = 0):
        super().__init__(message)
        self.available, self.requested = available, requested
        self.words, self.unmerged = words, unmerged


def corpus_bytes_needed(corpus_bytes: int, available: int, requested: int) -> int:
    """Roughly how much text like the corpus gives `requested` tokens where it gives
    `available`: a corpus's distinct words, hence the merges a WordPiece learner finds,
    grow about as its size to the power 0.4 (Heaps' law; State of the Union text: 0.3 MB
    has 6,008 distinct words and gives 5,992 tokens, 10.8 MB 25,215 and 25,992, where
    this estimate from the 0.3 MB says 15 MB for 30,000 tokens)."""
    return int(corpus_bytes * (requested / max(available, 1)) ** 2.5)


def too_small_message(vocab_size: int, num_reserved: int, corpus_bytes: int, words: int,
                      error: CorpusTooSmallError, min_frequency: int,
                      max_alphabet: int = 0) -> str:
    """build_vocab's one line for a --vocab_size the corpus cannot give, with what would
    help. Text like the corpus (Heaps' law, `corpus_bytes_needed`) or a lower
    --min_frequency helps only while some distinct word is not yet one token; a corpus whose
    every word the trainer learnt whole (a few words repeated) needs new words, not more of
    it: "about 0.029 MB of such text" for a 0.028 MB corpus of 13 words was no help."""
    gives = (f"give {error.available} WordPiece tokens besides the {num_reserved} reserved "
             f"ones, not {error.requested}")
    fits = f"use --vocab_size={error.available + num_reserved} or less"
    if not error.unmerged:
        learnt, alphabet = f"each of its {words:,} distinct words", ""
        if error.words != words:
            learnt = (f"each of the {error.words:,} of its {words:,} distinct words that "
                      f"--max_alphabet={max_alphabet} keeps")
            alphabet = ", a higher --max_alphabet"
        return (f"--vocab_size={vocab_size} is too large for the corpus: its "
                f"{megabytes(corpus_bytes)} {gives}, and {learnt} is already one of them: "
                "more of the same words, or a lower --min_frequency, gives no more; "
                f"{fits}{alphabet}, or text with more distinct words (natural text gives "
                "about one token per distinct word)")
    head = (f"--vocab_size={vocab_size} is too large for the corpus: its "
            f"{megabytes(corpus_bytes)} ({words:,} distinct words) {gives}")
    needed = corpus_bytes_needed(corpus_bytes, error.available, error.requested)
    text = (f"about {megabytes(needed)} of such text" if megabytes(needed) !=
            megabytes(corpus_bytes) else "a little more such text")
    return (f"{head}; {fits}, {text} for {vocab_size}, or a lower --min_frequency "
            f"(now {min_frequency})")


def megabytes(n: int) -> str:
    """`n` bytes in MB, with two significant digits below 10 MB ("0.012 MB", "3.4 MB",
    "150 MB"): a small corpus, and the little more it needs, is not "0 MB"."""
    mb = n / 1e6
    return f"{mb:.0f} MB" if mb >= 10 else f"{mb:.2g} MB"


def resolve_inputs(patterns: Sequence[str]) -> list[str]:
    """Expands files/globs into a sorted, de-duplicated file list (a path that exists as
    written is read as written: `files.glob_as_written`).

    Raises:
      BuildVocabError: a pattern matches nothing or names a directory.
    """
    paths: list[str] = []
    for pattern in files.split_patterns(patterns):
        matches = sorted(glob.glob(files.glob_as_written(pattern)))
        if not matches or not all(os.path.exists(m) for m in matches):
            raise BuildVocabError(f"--input {pattern!r} matches no file")
        for m in matches:
            if os.path.isdir(m):
                raise BuildVocabError(f"--input {m!r} is a directory; give files or a glob")
            if m not in paths:
                paths.append(m)
    return paths


def iter_lines(paths: Sequence[str], bytes_read: dict[str, int] | None = None) -> Iterator[str]:
    """Yields the lines of the files, decoded as UTF-8, as create_pretraining_data reads
    them: a "\\r" inside a line is dropped (kept, as a space, in a file whose lines all end
    in a lone "\\r").

    Args:
      paths: the files (a pipe is copied once: `files.rereadable`).
      bytes_read: if given, each file's bytes (decompressed) once it has been read: a
        pipe's size is known only then.

    Raises:
      files.TextFileError: a non-UTF-8 line or a NUL byte (file, line and byte offset
        named; a binary file fails so), as prepare_corpus and create_pretraining_data refuse
        them: a vocabulary learned from undecodable bytes would be garbage, and a corpus it
        accepted would fail at the next stage.
    """
    for path in paths:
        offset = number = 0
        try:
            # Lines as create_pretraining_data reads them (Google's tf.io.gfile reader): they
            # end at "\n" and every "\r" is dropped ("cat\rdog" is the word "catdog" in the
            # pretraining data, where the tokenizer would split it at a "\r" as at a space),
            # but in a file whose lines all end in a lone "\r": there they stay spaces.
            # A pipe (<(zcat corpus.gz)) is read once, into a temporary copy
            # (`files.rereadable`): the sniff would otherwise drain it, leaving no lines.
            with files.rereadable(path) as source:
                keep_cr = files.ends_lines_in_lone_cr(source)
                # .gz and .bz2 decompressed, as prepare_corpus and create_pretraining_data
                # read them.
                with files.open_input(source, "rb") as f:
                    for number, raw in enumerate(f, 1):
                        line = files.check_text_line(raw, path, number, offset)
                        if not keep_cr:
                            line = line.replace("\r", "")
                        # The byte-order mark Notepad writes first is no part of the text.
                        yield line[1:] if number == 1 and line.startswith("\ufeff") else line
                        offset += len(raw)
            if bytes_read is not None:
                bytes_read[path] = offset
        except (FileNotFoundError, PermissionError, IsADirectoryError):
            raise
        except files.PipeCopyError as e:  # not a damaged file: no room for the copy
            raise BuildVocabError(f"--input {e}") from None
        except (EOFError, zlib.error, OSError) as e:  # gzip's BadGzipFile, bz2's OSError
            raise BuildVocabError(f"--input {path}:{number + 1}: cannot be read "
                                  f"({type(e).__name__}: {e}); the file is damaged or "
                                  "truncated") from None


def count_words(lines: Iterable[str], pretokenizer: tokenization.BertPreTokenizer,
                max_unique_words: int = 5_000_000, batch_size: int = 4096,
                progress: Callable[[int, int, int], None] | None = None) -> collections.Counter:
    """Counts the tokenizer's words in a stream of lines.

    Args:
      lines: text lines (str).
      pretokenizer: the tokenizer's normalizer and word splitter.
      max_unique_words: when the table grows beyond this, words with the lowest counts are
        pruned until it holds at most half of it (memory bound; approximate for rare words).
      batch_size: lines per normalizer call.
      progress: called as progress(lines_done, chars_done, unique_words) after each batch.

    Returns:
      Counter word -> count, in first-seen order, without words over 100 characters. Exact
      unless the table had to be pruned.
    """
    if max_unique_words < 2:
        raise BuildVocabError(f"--max_unique_words must be >= 2, got {max_unique_words}")
    counts: collections.Counter = collections.Counter()
    n_lines = n_chars = 0
    batch: list[str] = []

    def flush() -> None:
        nonlocal batch
        for words in pretokenizer.split_words(batch):
            counts.update(w for w in words if len(w) <= schema.MAX_CHARS_PER_WORD)
        batch = []
        if len(counts) > max_unique_words:
            _prune(counts, max_unique_words // 2)

    for line in lines:
        batch.append(line)
        n_lines += 1
        n_chars += len(line)
        if len(batch) >= batch_size:
            flush()
            if progress:
                progress(n_lines, n_chars, len(counts))
    if batch:
        flush()
    if progress:
        progress(n_lines, n_chars, len(counts))
    return counts


def _prune(counts: collections.Counter, keep: int) -> None:
    """Drops the lowest counts (ties: all of them) until at most `keep` words remain."""
    by_count = sorted(counts.values(), reverse=True)
    threshold = by_count[keep] if keep < len(by_count) else 0
    for word in [w for w, c in counts.items() if c <= threshold]:
        del counts[word]
    logging.info("pruned the word table to %d words (dropped counts <= %d)", len(counts), threshold)


def _character_counts(word_counts: collections.Counter) -> collections.Counter:
    """character -> occurrences in the corpus the word counts describe."""
    counts: collections.Counter = collections.Counter()
    for word, count in word_counts.items():
        for ch in word:
            counts[ch] += count
    return counts


def continuation_characters(word_counts: collections.Counter) -> list[str]:
    """The characters that get a "##" piece, by code point: every character of a word of
    two or more characters, not only those seen inside one (module docstring, step 2)."""
    return sorted({ch for w in word_counts if len(w) > 1 for ch in w})


def train_wordpiece(word_counts: collections.Counter, num_tokens: int, min_frequency: int = 2,
                    max_alphabet: int = 0, alphabet: Iterable[str] = ()) -> list[str]:
    """Learns exactly `num_tokens` WordPiece tokens with Hugging Face's WordPieceTrainer.

    Args:
      word_counts: word -> count (normalized words, as the tokenizer sees them).
      num_tokens: number of tokens to learn (the vocabulary minus the reserved tokens).
      min_frequency: minimum pair count for a merge.
      max_alphabet: keep only the this many most frequent characters (0 = all); words with
        other characters are left out of training (the tokenizer makes them [UNK]).
      alphabet: characters kept whether or not the corpus has them (and whatever
        max_alphabet says): each as a word-initial token and, unless the tokenizer always
        splits it off (punctuation), as a "##" piece (the trainer's `initial_alphabet`).

    Returns:
      list[str] of `num_tokens` tokens: the characters (by code point), then the "##"
      continuation characters (by code point), then the merged tokens in learning order.

    Raises:
      BuildVocabError: the corpus yields fewer tokens (too small, or min_frequency too high)
        or more characters than `num_tokens`.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    if not word_counts:
        raise BuildVocabError("the corpus has no words")
    prefix = schema.SUFFIX_INDICATOR
    alphabet = sorted(set(alphabet))
    if max_alphabet:
        char_counts = _character_counts(word_counts)
        ranked = sorted(char_counts, key=lambda c: (-char_counts[c], c))
        allowed = set(ranked[:max_alphabet]) | set(alphabet)
        word_counts = collections.Counter(
            {w: c for w, c in word_counts.items() if all(ch in allowed for ch in w)})
        if not word_counts:
            raise BuildVocabError(
                f"--max_alphabet={max_alphabet} leaves no word to learn from: every word of "
                f"the corpus has a character outside its {max_alphabet} most frequent; raise "
                "--max_alphabet (0 keeps every character)")
    initial = sorted({w[0] for w in word_counts} | set(alphabet))
    continuing = sorted(set(continuation_characters(word_counts))
                        | {ch for ch in alphabet if not tokenization.is_punctuation(ch)})
    # Determinism: the trainer numbers the "##x" pieces in hash-map order and breaks ties
    # between equally frequent pairs by those numbers. Declaring every "##x" up front (as
    # "special" tokens, numbered in this order) makes all numbers, hence all merges, fixed.
    declared = [prefix + ch for ch in continuing]
    if len(initial) + len(declared) > num_tokens:
        seen = {ch for w in word_counts for ch in w}
        added = len(set(initial) - seen) + len(set(continuing) - seen)
        raise BuildVocabError(
            f"the corpus has {len(initial)} characters and {len(declared)} continuation "
            f"characters, more than the {num_tokens} tokens that fit: raise --vocab_size or "
            f"set --max_alphabet"
            + (f" ({added} of them are printable ASCII the corpus lacks: "
               f"--noascii_alphabet leaves those out)" if added else ""))
    tokenizer = Tokenizer(models.WordPiece(unk_token=schema.UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordPieceTrainer(
        vocab_size=num_tokens, min_frequency=min_frequency, show_progress=False,
        special_tokens=declared, continuing_subword_prefix=prefix, initial_alphabet=alphabet)

    def feed() -> Iterator[str]:
        # The trainer counts whitespace-separated words itself; give it each word `count`
        # times, in chunks of about 1 MB, so no corpus-sized string is built.
        chunk: list[str] = []
        size = 0
        for word, count in word_counts.items():
            while count > 0:
                n = min(count, max(1, (1 << 20) // (len(word) + 1)))
                chunk.append((word + " ") * n)
                size += n * (len(word) + 1)
                count -= n
                if size >= 1 << 20:
                    yield "".join(chunk)
                    chunk, size = [], 0
        if chunk:
            yield "".join(chunk)

    tokenizer.train_from_iterator(feed(), trainer=trainer)
    vocab = tokenizer.get_vocab()
    learned = sorted(vocab, key=vocab.__getitem__)
    if len(learned) < num_tokens:
        # A word the trainer made one token has no merge left in it: once every word is,
        # neither repeats of the same words nor a lower --min_frequency give more tokens.
        unmerged = sum(1 for w in word_counts if w not in vocab)
        more = (f"a lower --min_frequency (now {min_frequency}), or a larger corpus"
                if unmerged else f"text with more distinct words (each of the "
                f"{len(word_counts)} is already a token)")
        raise CorpusTooSmallError(
            f"the corpus gives only {len(learned)} WordPiece tokens, not the {num_tokens} "
            f"requested (after reserved tokens): use a smaller --vocab_size or {more}",
            len(learned), num_tokens, len(word_counts), unmerged)
    # Characters, then continuation characters, then merges in learning order.
    first = set(initial) | set(declared)
    merged = [t for t in learned if t not in first]
    room = num_tokens - len(initial) - len(declared)
    if len(merged) > room:
        # The trainer's alphabet also holds every character that only continues words, as a
        # word-initial token; it stops merging once its alphabet fills `num_tokens`, and
        # returns the whole alphabet when it does not fit (Hangul syllables in a small
        # vocabulary). No merge was made then: keep the most frequent of those characters.
        char_counts = _character_counts(word_counts)
        kept = set(sorted(merged, key=lambda t: (-char_counts[t], t))[:room])
        logging.warning("the corpus has %d characters that begin no word; %d of them fit "
                        "as word-initial tokens (the most frequent); raise --vocab_size by %d "
                        "to keep them all", len(merged), room, len(merged) - room)
        merged = [t for t in merged if t in kept]
    tokens = initial + declared + merged
    if len(tokens) != num_tokens or len(set(tokens)) != num_tokens:
        raise BuildVocabError(f"internal error: trainer returned {len(learned)} tokens, "
                              f"{len(set(tokens))} distinct, expected {num_tokens}")
    return tokens


def ascii_alphabet(do_lower_case: bool) -> list[str]:
    """The printable ASCII characters as the tokenizer sees them (lowercased with
    `do_lower_case`): what --ascii_alphabet keeps in every vocabulary."""
    chars = (chr(c) for c in range(0x21, 0x7F))
    return sorted({ch.lower() if do_lower_case else ch for ch in chars})


def reserved_tokens(layout: str, num_unused: int | None = None) -> list[str]:
    """The special and [unusedN] tokens of a layout, in id order.

    Raises:
      BuildVocabError: unknown layout, or google layout with fewer than 99 unused tokens.
    """
    if layout not in LAYOUTS:
        raise BuildVocabError(f"--layout must be one of {LAYOUTS}, got {layout!r}")
    if num_unused is None:
        num_unused = GOOGLE_NUM_UNUSED if layout == "google" else 0
    unused = [f"[unused{i}]" for i in range(num_unused)]
    if layout == "google":
        if num_unused < 99:
            raise BuildVocabError(
                f"--layout=google puts [UNK] at id 100 after [PAD] and [unused0]..[unused98]; "
                f"it needs --num_unused >= 99, got {num_unused}")
        return ([schema.PAD] + unused[:99] +
                [schema.UNK, schema.CLS, schema.SEP, schema.MASK] + unused[99:])
    if num_unused < 0:
        raise BuildVocabError(f"--num_unused must be >= 0, got {num_unused}")
    return list(schema.SPECIAL_TOKENS) + unused


def build_vocab(paths: Sequence[str], vocab_size: int, layout: str = "google",
                num_unused: int | None = None, do_lower_case: bool = True,
                strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
                min_frequency: int = 2, max_alphabet: int = 0, keep_ascii: bool = True,
                max_unique_words: int = 5_000_000, log_every_s: float = 10.0) -> list[str]:
    """Learns a vocabulary of exactly `vocab_size` tokens from text files.

    Args: see the flags of the same names (strip_accents None = follow do_lower_case;
      keep_ascii: --ascii_alphabet).

    Returns:
      list[str] of `vocab_size` tokens in id order.

    Raises:
      BuildVocabError: bad arguments or a corpus too small for the requested size.
    """
    reserved = reserved_tokens(layout, num_unused)
    if vocab_size <= len(reserved):
        raise BuildVocabError(f"--vocab_size={vocab_size} leaves no room after the "
                              f"{len(reserved)} reserved tokens of --layout={layout}")
    pretokenizer = tokenization.pretokenizer(do_lower_case, strip_accents, tokenize_chinese_chars)
    # A pipe's size is known only once it is read (os.path.getsize says 0): the progress
    # gives the files' size and counts the pipes, whose text shows in the characters read.
    pipes = sum(files.is_pipe(p) for p in paths)
    size = f"{sum(os.path.getsize(p) for p in paths if not files.is_pipe(p)) / 1e6:.1f} MB"
    if pipes:
        size += f" and {pipes} pipe{'s' if pipes > 1 else ''} of unknown size"
    logging.info("counting words in %d file(s), %s", len(paths), size)
    start = last = time.monotonic()

    def progress(n_lines: int, n_chars: int, n_words: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= log_every_s:
            last = now
            logging.info("read %d lines, %.1f M characters (files: %s); %d distinct words; "
                         "%.1f s", n_lines, n_chars / 1e6, size, n_words, now - start)

    read: dict[str, int] = {}
    counts = count_words(iter_lines(paths, read), pretokenizer, max_unique_words,
                         progress=progress)
    # The corpus's size for the messages below: a pipe's is what was read of it.
    total_bytes = sum(read.get(p, 0) if files.is_pipe(p) else os.path.getsize(p) for p in paths)
    if not counts:
        raise BuildVocabError(f"--input {', '.join(paths[:3])}{' ...' if len(paths) > 3 else ''}"
                              ": no words in it; expected UTF-8 text")
    logging.info("counted %d distinct words (%d occurrences) in %.1f s; training WordPiece",
                 len(counts), sum(counts.values()), time.monotonic() - start)
    try:
        learned = train_wordpiece(counts, vocab_size - len(reserved), min_frequency,
                                  max_alphabet,
                                  ascii_alphabet(do_lower_case) if keep_ascii else ())
    except CorpusTooSmallError as e:
        raise CorpusTooSmallError(
            too_small_message(vocab_size, len(reserved), total_bytes, len(counts), e,
                              min_frequency, max_alphabet), e.available, e.requested, e.words,
            e.unmerged) from None
    clash = set(learned) & set(reserved)
    if clash:  # cannot happen: reserved tokens contain "[", which is never inside a word
        raise BuildVocabError(f"learned tokens collide with reserved tokens: {sorted(clash)}")
    logging.info("learned %d tokens in %.1f s in total", len(learned), time.monotonic() - start)
    return reserved + learned


def write_vocab(tokens: Sequence[str], path: str, overwrite: bool = False,
                config: TokenizerConfig | None = None) -> None:
    """Writes one token per line (atomically) and the tokenizer settings beside it.

    Args:
      tokens: the vocabulary in id order.
      path: the vocab file; tokenizer_config.json goes into the same directory.
      overwrite: replace existing files.
      config: the settings the vocabulary was learned with (default: BERT's uncased ones).

    Raises:
      BuildVocabError: `path` exists, or the directory holds the tokenizer_config.json of
        another vocabulary, and overwrite is False.
    """
    config = config or TokenizerConfig()
    settings_path = tokenizer_config.path_for_vocab(path)
    if not overwrite:
        if os.path.exists(path):
            raise BuildVocabError(f"--output {path!r} already exists; pass --overwrite to replace it")
        if os.path.exists(settings_path) and not _left_by_an_interrupted_write(settings_path,
                                                                               path):
            raise BuildVocabError(
                f"{settings_path} already exists (the tokenizer settings of another "
                "vocabulary); write each vocabulary into its own directory, or pass --overwrite")
    # The vocabulary comes last (the one it replaces removed first): an interrupted write
    # never leaves one beside another's settings, nor without its own (read as uncased).
    with files.atomic_output(path, overwrite=overwrite) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            for token in tokens:
                f.write(token + "\n")
        if os.path.lexists(path):
            os.remove(path)
        tokenizer_config.write_for_vocab(path, config, overwrite=True)


def _left_by_an_interrupted_write(settings_path: str, vocab_path: str) -> bool:
    """Whether tokenizer_config.json is that of `vocab_path` (which does not exist): what
    an interrupted write_vocab left, replaced by the next."""
    try:
        names = files.read_json(settings_path).get("bert_keras", {}).get("vocab_file")
    except (OSError, ValueError, AttributeError):
        return False
    return names == os.path.basename(vocab_path)


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    for holder in (_INPUT, _OUTPUT, _VOCAB_SIZE):
        if holder.value is None:
            raise app.UsageError(f"--{holder.name} is required")
    try:
        config = tokenizer_config.from_values(**{k: h.value for k, h in _TOKENIZER_FLAGS.items()})
        paths = resolve_inputs(_INPUT.value)
        files.refuse_an_input(_OUTPUT.value, "--output", paths, "--input")
        if files.names_a_directory(_OUTPUT.value) or os.path.isdir(_OUTPUT.value):
            raise BuildVocabError(f"--output {_OUTPUT.value} is a directory; name the "
                                  f"vocabulary file (e.g. "
                                  f"{os.path.join(_OUTPUT.value, files.VOCAB_FILE)})")
        settings_path = tokenizer_config.path_for_vocab(_OUTPUT.value)
        if not _OVERWRITE.value:
            for existing in (_OUTPUT.value, settings_path):
                if os.path.exists(existing):
                    raise BuildVocabError(f"{existing!r} already exists; pass --overwrite to "
                                          "replace it, or write the vocabulary elsewhere")
        # Before the training (minutes on a large corpus), not when it is written.
        files.check_writable([_OUTPUT.value, settings_path])
        tokens = build_vocab(
            paths, _VOCAB_SIZE.value, layout=_LAYOUT.value, num_unused=_NUM_UNUSED.value,
            do_lower_case=config.do_lower_case, strip_accents=config.strip_accents,
            tokenize_chinese_chars=config.tokenize_chinese_chars,
            min_frequency=_MIN_FREQUENCY.value, max_alphabet=_MAX_ALPHABET.value,
            keep_ascii=_ASCII_ALPHABET.value, max_unique_words=_MAX_UNIQUE_WORDS.value)
        write_vocab(tokens, _OUTPUT.value, overwrite=_OVERWRITE.value, config=config)
    except (BuildVocabError, tokenizer_config.TokenizerConfigError) as e:
        raise app.UsageError(str(e)) from None
    logging.info("wrote %d tokens to %s and the tokenizer settings (%s) to %s", len(tokens),
                 _OUTPUT.value, config.describe(), settings_path)
    if os.path.basename(_OUTPUT.value) != files.VOCAB_FILE:
        # The other stages take any name; transformers finds only vocab.txt, and without it
        # builds a tokenizer of the 5 special tokens, every word [UNK], without an error.
        logging.warning("transformers' AutoTokenizer reads a directory's %s, not %s: rename "
                        "it (the settings beside it follow) to use the directory there",
                        files.VOCAB_FILE, os.path.basename(_OUTPUT.value))


if __name__ == "__main__":
    from data_prep import cli

    cli.mark_required(["input", "output", "vocab_size"])
    cli.run(main)
