"""tf.data pipelines for BERT pretraining over TFRecord files (schema: data_prep.features).

    files --(shard per input pipeline)--> per pass: shuffle files by (seed, pass) --> interleave
    records --> shuffle records --> batch(drop_remainder) --> [skip] --> parse --> [mask]
    --> prefetch

Elements are `(features, labels, sample_weights)` as `BertPretrainer.fit` wants them
(B = per-replica batch, S = max_seq_length, P = max_predictions_per_seq):

    features        input_word_ids, input_mask, input_type_ids: int32 [B, S];
                    masked_lm_positions: int32 [B, P]
    labels          mlm_logits: masked_lm_ids int32 [B, P];  nsp_logits: int32 [B]
    sample_weights  mlm_logits: masked_lm_weights float32 [B, P];  nsp_logits: ones [B]

Before reading, every file is checked against the trainer's S and P: through its sidecar
(`data_prep.features.check_sidecar`), or, for files without one (Google's and Model Garden's
`create_pretraining_data.py` write none), by parsing its first record. A mismatch fails
with the file, both lengths and the fix, not with a parse error deep inside `fit` (the most
common BERT data error: google-research/bert issues 752 and 1365).

`check_integrity` walks each file's record framing to its end and compares its record
count with its sidecar (a truncated shard is otherwise read silently up to the cut); the
trainer runs it once before building pipelines.

Order is deterministic for a given `seed` and input-pipeline layout, and the same for every
iterator of a dataset, so a resumed run can skip exactly the batches it already trained on
(`skip_batches`), whatever iterators Keras makes.

Data without masks (`create_pretraining_data --dynamic_masking`; `input_masking` tells from
the sidecars, or from the first record of files without one) is masked after parsing by
`bert_keras.masking.mask_batch`, seeded by (seed, input pipeline, batch index in the
stream): the same masks from every iterator and after a resumption, new ones on every pass.
Evaluation pipelines mask with seed 0 unless given one, so every evaluation scores the same
predictions.
"""

from __future__ import annotations

import random

import tensorflow as tf

from data_prep import cli, features, schema

# Records shuffled together; Google's run_pretraining.py uses 100 after a file-level
# shuffle and a parallel interleave. A larger buffer mixes documents better at ~1 KB a record.
DEFAULT_SHUFFLE_BUFFER = 1000
# Files read concurrently by the interleave.
DEFAULT_CYCLE_LENGTH = 4


def _describe_record(record: bytes) -> str:
    """What a record actually holds (lengths of the schema's features), for error messages."""
    try:
        example = tf.train.Example.FromString(record)
    except Exception:  # noqa: BLE001 - any decoding problem: it is not a tf.train.Example.
        return "it is not a serialized tf.train.Example"
    lengths = []
    for name in (schema.INPUT_IDS, schema.MASKED_LM_POSITIONS):
        feature = example.features.feature.get(name)
        if feature is None:
            lengths.append(f"no {name} feature")
        else:
            kind = feature.WhichOneof("kind")
            lengths.append(f"{name} of length {len(getattr(feature, kind).value) if kind else 0}")
    return "its first record has " + " and ".join(lengths)


def _first_record(path: str, compression: str):
    try:
        return next(iter(tf.data.TFRecordDataset(path, compression).take(1)), None)
    except tf.errors.OpError as e:
        raise ValueError(f"pretraining data {path} is not a readable TFRecord file "
                         f"({cli.first_line(e)})") from None


def input_masking(files) -> str:
    """Whether pretraining files hold masks: "static" (Google's layout) or "dynamic" (none).

    From each file's sidecar (`"masking"`), else from its first record (files of Google's
    tool have the masked_lm_* features). Empty files without a sidecar say nothing.

    Raises:
      ValueError: the files mix the two kinds (naming one of each), or a file is unreadable.
    """
    found = {}
    for path in files:
        kind = features.sidecar_masking(features.read_sidecar(path))
        if kind is None:
            first = _first_record(path, features.compression_type(path))
            if first is None:
                continue
            try:
                example = tf.train.Example.FromString(first.numpy())
                has_masks = schema.MASKED_LM_POSITIONS in example.features.feature
            except Exception:  # noqa: BLE001 - check_input_files names the problem.
                has_masks = True
            kind = features.STATIC_MASKING if has_masks else features.DYNAMIC_MASKING
        found.setdefault(kind, path)
        if len(found) > 1:
            raise ValueError(
                f"pretraining files mix statically masked data ({found[features.STATIC_MASKING]}) "
                f"and data without masks ({found[features.DYNAMIC_MASKING]}, from "
                "create_pretraining_data --dynamic_masking); use one kind per run")
    return next(iter(found), features.STATIC_MASKING)


def check_input_files(files, max_seq_length: int, max_predictions_per_seq: int | None) -> str:
    """Checks pretraining files against the trainer's lengths; returns their compression.

    Args:
      files: list of TFRecord paths (from `data_prep.features.expand_input_files`).
      max_seq_length: S the model will be fed.
      max_predictions_per_seq: P the model will be fed; None for data without masks (only S
        is checked).

    Returns:
      The TFRecord compression type shared by all files ("" or "GZIP").

    Raises:
      ValueError: naming the file, for a sidecar that disagrees with S or P, a file without
        sidecar whose first record does not parse at S and P, or mixed compression; or two
        shard sets of one create_pretraining_data output prefix
        (`data_prep.features.check_shard_sets`).
    """
    features.check_shard_sets(files)
    compressions = {}
    for path in files:
        meta = features.read_sidecar(path)
        features.check_sidecar(meta, max_seq_length, max_predictions_per_seq, source=path)
        compression = features.compression_type(path)
        compressions.setdefault(compression, path)
        if meta is not None:
            continue
        # No sidecar: the first record must parse at the trainer's lengths.
        first = _first_record(path, compression)
        if first is None:
            continue  # An empty shard contributes nothing and breaks nothing.
        try:
            features.parse_pretraining_example(first, max_seq_length, max_predictions_per_seq)
        except (tf.errors.InvalidArgumentError, ValueError):
            raise ValueError(
                f"pretraining data {path} (no sidecar) does not parse with "
                f"max_seq_length={max_seq_length}, "
                f"max_predictions_per_seq={max_predictions_per_seq}: "
                f"{_describe_record(first.numpy())}. Use the lengths the data was written "
                "with, or regenerate the data."
            ) from None
    if len(compressions) > 1:
        examples = ", ".join(f"{c or 'none'} ({p})" for c, p in compressions.items())
        raise ValueError(f"pretraining files mix compression types: {examples}")
    return next(iter(compressions), "")


class NoRecordsError(ValueError):
    """The data files hold no record at all: a repeated pipeline over them never yields one
    (`pretraining_dataset`'s, and so fit, would wait forever)."""


def check_integrity(files, skip_damaged: bool = False, warn=None) -> list[str]:
    """Checks that every file is whole: framing to its end, record count against its sidecar.

    TensorFlow's TFRecord reader stops silently at a record cut short, so a shard truncated
    by an interrupted copy would be trained on (and cycled) without a word; this walks each
    file's record headers first (`data_prep.features.check_shard`: about 1.4 s per GB of
    uncompressed data in the page cache; GZIP files are decompressed).

    Args:
      files: list of TFRecord paths (from `data_prep.features.expand_input_files`).
      skip_damaged: leave damaged files out (each reported through `warn`) instead of
        raising; still an error when every file is damaged.
      warn: called with one line per skipped file (default: absl logging.warning).

    Returns:
      The files to read: all of them, or the sound ones with `skip_damaged`.

    Raises:
      data_prep.features.DamagedDataError (a ValueError): the first damaged file, naming it,
        what is wrong and the records expected and found; or, with `skip_damaged`, every
        file is damaged.
      NoRecordsError: the files to read hold no record.
    """
    if warn is None:
        from absl import logging

        warn = logging.warning
    sound, damaged, records = [], [], 0
    for path in files:
        try:
            records += features.check_shard(path, features.read_sidecar(path)).records
        except features.DamagedDataError as e:
            if not skip_damaged:
                raise
            damaged.append(path)
            warn(f"skipping damaged data: {e}")
            continue
        sound.append(path)
    if damaged and not sound:
        raise features.DamagedDataError(
            f"all {len(files)} data files are damaged (the first: {damaged[0]}); nothing is "
            "left to read")
    if sound and not records:
        names = ", ".join(sound[:3]) + (" ..." if len(sound) > 3 else "")
        raise NoRecordsError(f"no record in {names}; expected pretraining instances")
    return sound


def _mask_dynamically(parsed, masking, seed):
    """Adds the masks of `bert_keras.masking.mask_batch` to a parsed batch without them."""
    from bert_keras.masking import mask_batch

    parsed = dict(parsed)
    parsed.update(mask_batch(parsed[schema.INPUT_WORD_IDS], parsed[schema.MODEL_INPUT_MASK],
                             masking, seed))
    return parsed


def _to_fit_triple(parsed):
    inputs = {name: parsed[name] for name in schema.MODEL_INPUT_NAMES}
    inputs[schema.MASKED_LM_POSITIONS] = parsed[schema.MASKED_LM_POSITIONS]
    nsp_labels = tf.reshape(parsed[schema.NEXT_SENTENCE_LABELS], [-1])  # [B, 1] -> [B]
    labels = {"mlm_logits": parsed[schema.MASKED_LM_IDS], "nsp_logits": nsp_labels}
    weights = {
        "mlm_logits": parsed[schema.MASKED_LM_WEIGHTS],
        "nsp_logits": tf.ones_like(nsp_labels, dtype=tf.float32),
    }
    return inputs, labels, weights


def pretraining_dataset(
    input_files,
    batch_size: int,
    max_seq_length: int,
    max_predictions_per_seq: int,
    *,
    is_training: bool = True,
    repeat: bool | None = None,
    seed: int | None = None,
    input_context: tf.distribute.InputContext | None = None,
    skip_batches: int = 0,
    shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER,
    cycle_length: int = DEFAULT_CYCLE_LENGTH,
    autotune: bool = True,
    masking=None,
) -> tf.data.Dataset:
    """The pretraining input pipeline.

    Args:
      input_files: comma-separated files/globs, or a list of them.
      batch_size: Python int, examples per batch of *this* pipeline (the per-replica batch
        under `distribute_datasets_from_function`: `input_context.get_per_replica_batch_size`).
      max_seq_length: S; checked against each file's sidecar (or first record).
      max_predictions_per_seq: P; likewise.
      is_training: if True, shuffle files and records; if False, read them in order
        (evaluation).
      repeat: cycle through the files forever; defaults to `is_training`.
      seed: Python int; makes the order reproducible (needed for exact resumption).
      input_context: from `strategy.distribute_datasets_from_function`; this pipeline then
        reads only its share: whole files when there are at least as many files as
        pipelines, else every n-th record.
      skip_batches: batches of this pipeline to skip first (a resumed run's consumed data).
      shuffle_buffer_size: records in the shuffle buffer.
      cycle_length: files read concurrently.
      autotune: False fixes parallelism and prefetch at 2 and disables tf.data autotuning
        (tests: autotune can delay the end of `fit` by seconds; docs/DESIGN.md section 9).
      masking: a `bert_keras.masking.DynamicMasking`, required for data without masks
        (`input_masking` says "dynamic") and refused for statically masked data; its
        max_predictions_per_seq must equal `max_predictions_per_seq`.

    Returns:
      A `tf.data.Dataset` of `(features, labels, sample_weights)` with static shapes.

    Raises:
      ValueError: no file matches, a file does not fit S and P (see `check_input_files`),
        or `masking` does not fit the data.
    """
    files = features.expand_input_files(input_files)
    dynamic = input_masking(files) == features.DYNAMIC_MASKING
    if dynamic and masking is None:
        raise ValueError(f"pretraining data {files[0]} has no masks (create_pretraining_data "
                         "--dynamic_masking): masking needs the vocabulary (--vocab_file)")
    if not dynamic and masking is not None:
        raise ValueError(f"pretraining data {files[0]} is already masked; dynamic masking "
                         "applies to data from create_pretraining_data --dynamic_masking")
    if dynamic and masking.max_predictions_per_seq != max_predictions_per_seq:
        raise ValueError(f"masking.max_predictions_per_seq={masking.max_predictions_per_seq} "
                         f"differs from max_predictions_per_seq={max_predictions_per_seq}")
    file_predictions = None if dynamic else max_predictions_per_seq
    compression = check_input_files(files, max_seq_length, file_predictions)
    parallel = tf.data.AUTOTUNE if autotune else 2

    shard_records = False
    pipeline_id, num_pipelines = 0, 1
    if input_context is not None:
        pipeline_id = input_context.input_pipeline_id
        num_pipelines = input_context.num_input_pipelines
    if input_context is not None and input_context.num_input_pipelines > 1:
        if len(files) >= input_context.num_input_pipelines:
            files = files[input_context.input_pipeline_id::input_context.num_input_pipelines]
        else:
            shard_records = True
    repeat = is_training if repeat is None else repeat
    if is_training:
        # Every pass over the files in its own order, a pure function of (seed, pass): every
        # iterator of this dataset yields the same stream. (With reshuffle_each_iteration
        # the stream depended on how many iterators had been made before, and Keras' fit
        # under a tf.distribute strategy makes two: one it takes a batch from to build the
        # model, then the one it trains on, so a resumed run read other data.)
        if seed is None:
            seed = random.SystemRandom().randrange(2**31)
        names = tf.constant(files)
        passes = tf.data.Dataset.counter() if repeat else tf.data.Dataset.range(1)
        dataset = passes.map(lambda p: tf.random.experimental.stateless_shuffle(
            names, seed=tf.stack([tf.constant(seed, tf.int64), p]))).unbatch()
    else:
        dataset = tf.data.Dataset.from_tensor_slices(files)
        if repeat:
            dataset = dataset.repeat()
    cycle = max(1, min(cycle_length, len(files)))
    dataset = dataset.interleave(
        lambda path: tf.data.TFRecordDataset(path, compression_type=compression),
        cycle_length=cycle,
        block_length=1,
        num_parallel_calls=parallel if autotune else min(parallel, cycle),
        deterministic=True,
    )
    if shard_records:
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if is_training:
        # One shuffle over the endless stream: the same for every iterator.
        dataset = dataset.shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=False)
    # Static batch dimension for TPUs and XLA.
    dataset = dataset.batch(batch_size, drop_remainder=True)
    if dynamic:
        # The batch's index in this pipeline's stream (counted before the skip, so a resumed
        # run masks its batches as the uninterrupted run did) seeds its masks.
        mask_seed = tf.constant(seed if seed is not None else 0, tf.int64)
        dataset = dataset.enumerate()

        def parse(index, serialized):
            parsed = features.parse_pretraining_example(serialized, max_seq_length, None)
            batch_seed = tf.stack([mask_seed, index * num_pipelines + pipeline_id])
            return _to_fit_triple(_mask_dynamically(parsed, masking, batch_seed))
    else:
        def parse(serialized):
            return _to_fit_triple(features.parse_pretraining_example(
                serialized, max_seq_length, max_predictions_per_seq))
    if skip_batches:
        dataset = dataset.skip(skip_batches)  # Before parsing: skipped batches cost only I/O.
    dataset = dataset.map(parse, num_parallel_calls=parallel, deterministic=True)
    dataset = dataset.prefetch(parallel)

    options = tf.data.Options()
    options.deterministic = True
    if input_context is not None:
        # This function already took this pipeline's share.
        policy = tf.data.experimental.AutoShardPolicy.OFF
        options.experimental_distribute.auto_shard_policy = policy
    if not autotune:
        options.autotune.enabled = False
    return dataset.with_options(options)
