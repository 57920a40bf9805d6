"""Fine-tuning models built on a BertEncoder: sentence classifier, token tagger, span QA.

Each task model is a functional `keras.Model` that takes a `BertEncoder` *instance* (its
weights are shared, not copied), reuses the encoder's three named inputs, and adds one small
head (Devlin et al. 2018, section 4, figure 4):

  BertClassifier  pooled_output -> dropout -> Dense(C)     {"logits": [B, C]}
  BertRegressor   pooled_output -> dropout -> Dense(1)     {"score": [B]}
  BertTagger      sequence_output -> dropout -> Dense(C)   {"logits": [B, S, C]}
  BertSpanQA      sequence_output -> Dense(2)              {"start_logits": [B, S],
                                                            "end_logits": [B, S]}

Shapes: B = batch, S = sequence length, H = hidden size, C = number of labels.
Inputs are the encoder's: int32 `input_word_ids`, `input_mask`, `input_type_ids`, [B, S].
Logits are float32 even under a mixed dtype policy, so the losses stay in float32.

The models are trained with plain `compile`/`fit`; `compile_args` below gives the matching
losses and metrics (tagging ignores label -1: [CLS], [SEP], padding and non-first sub-tokens).

The classifier and the tagger train padding-free by default (`skip_padding`): the encoder's
layers run on the real tokens of a batch only, with the padded computation's loss and
gradients (`bert_keras.layers.padding_free`). Span QA does not: its softmax runs over
every position, padding included, as in Google's run_squad.py.
"""

import keras
from keras import ops

from bert_keras.encoder import (BertEncoder, ListsEncoderWhole, TrainsPoolerOnlyWhenRead,
                                check_functional_kwargs)
from bert_keras.layers.activations import clone_initializer
from bert_keras.layers.dense import KERNEL_LAYOUTS, Dense
# The label value the tagging loss and metrics ignore (non-first sub-tokens, [CLS], [SEP],
# padding); defined once in the schema, which the data converters share.
from data_prep import schema
from data_prep.schema import IGNORE_LABEL


def _check_encoder(encoder, model, kwargs):
    check_functional_kwargs(type(model), kwargs)
    if not isinstance(encoder, BertEncoder):
        raise ValueError(f"`encoder` must be a BertEncoder. Received: {type(encoder).__name__}")


def _check_num_classes(num_classes):
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"`num_classes` must be a positive integer. Received: num_classes={num_classes!r}")


def _check_dropout(dropout):
    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0 <= dropout < 1:
        raise ValueError(f"`dropout` must be in [0, 1). Received: dropout={dropout!r}")


# How a head's kernel starts (biases start at zero):
#   "normal"            N(0, initializer_range): transformers' heads. The default: on issue
#                       29's Brown POS benchmark (MiniLM, 250 updates) it scores about 5
#                       points higher than Google's, at every seed tried (BUILD_NOTES 8.5).
#   "truncated_normal"  N(0, initializer_range) cut at 2 standard deviations (std 0.88x):
#                       Google's run_classifier.py / run_squad.py, for exact reproduction.
HEAD_INITIALIZERS = ("normal", "truncated_normal")


def _check_head_initializer(head_initializer):
    if head_initializer not in HEAD_INITIALIZERS:
        raise ValueError(f"`head_initializer` must be one of {HEAD_INITIALIZERS}. "
                         f"Received: head_initializer={head_initializer!r}")


def _check_skip_padding(skip_padding):
    if not isinstance(skip_padding, bool):
        raise ValueError(f"`skip_padding` must be True or False. Received: skip_padding={skip_padding!r}")


def _initializer(encoder, head_initializer):
    cls = (keras.initializers.RandomNormal if head_initializer == "normal"
           else keras.initializers.TruncatedNormal)
    return clone_initializer(cls(stddev=encoder.initializer_range))


class _TaskModel(TrainsPoolerOnlyWhenRead, ListsEncoderWhole, keras.Model):
    """Shared config plumbing: every task stores `encoder` and serializes it. (The graphs
    call the encoder's layers one by one: `ListsEncoderWhole` keeps the weight files in the
    whole-encoder layout.)

    A head that never reads the pooled output (tagging, span QA) sets `reads_pooler =
    False`: `TrainsPoolerOnlyWhenRead` leaves the pooler out of its trainable weights.
    """

    def _base_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "encoder": keras.layers.serialize(self.encoder),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["encoder"] = keras.layers.deserialize(config["encoder"])
        return cls(**config)


def _pooled_head(encoder, inputs, units, dropout, head_initializer, skip_padding):
    """(dropout layer, Dense layer "classifier", float32 outputs [B, units]) of a head on the
    pooled [CLS] vector. Only [CLS] is read, so the last layer runs at that one position
    (the same values as the full encoder's pooled_output, at about 1/S of the last layer's
    cost)."""
    _check_dropout(dropout)
    _check_head_initializer(head_initializer)
    _check_skip_padding(skip_padding)
    head_dropout = keras.layers.Dropout(dropout, dtype=encoder.layers_dtype_policy,
                                        name="classifier_dropout")
    head = Dense(units, kernel_initializer=_initializer(encoder, head_initializer),
                 dtype=encoder.layers_dtype_policy, name="classifier")
    cls_position = ops.zeros_like(inputs[schema.INPUT_WORD_IDS][:, :1])  # [B, 1]
    cls_vector = encoder.last_layer_at(inputs, cls_position,
                                       skip_padding=skip_padding)[:, 0, :]  # [B, H]
    pooled = encoder.pooler_layer(cls_vector)  # [B, H]
    return head_dropout, head, ops.cast(head(head_dropout(pooled)), "float32")


@keras.saving.register_keras_serializable(package="bert_keras")
class BertClassifier(_TaskModel):
    """Sentence (or sentence-pair) classifier: Dense(C) on the pooled [CLS] vector.

    Inputs: the encoder's dict of int32 [B, S] tensors. For a pair, `input_type_ids` is 0 on
    "[CLS] A [SEP]" and 1 on "B [SEP]" (see `data_prep.packing`).

    Outputs: {"logits": float32 [B, C]}, unnormalised class scores.

    Args:
      encoder: a `BertEncoder`; its weights are shared, not copied.
      num_classes: C.
      dropout: dropout rate on the pooled output (Google's run_classifier uses 0.1).
      head_initializer: "normal" or "truncated_normal" (Google's), for the head's kernel
        (std: the encoder's initializer_range; see `HEAD_INITIALIZERS`).
      skip_padding: in training, run the encoder's layers on real tokens only (see
        `bert_keras.layers.padding_free`): the same loss and gradients, less work when
        sequences are padded. False runs the padded computation. Inference is padded
        either way.
    """

    def __init__(self, encoder, num_classes, dropout=0.1, head_initializer="normal",
                 skip_padding=True, **kwargs):
        _check_encoder(encoder, self, kwargs)
        _check_num_classes(num_classes)
        inputs = dict(encoder.input)
        head_dropout, head, logits = _pooled_head(encoder, inputs, num_classes, dropout,
                                                  head_initializer, skip_padding)  # [B, C]
        super().__init__(inputs=inputs, outputs={"logits": logits}, **kwargs)

        self.encoder = encoder
        self.num_classes = num_classes
        self.dropout = dropout
        self.head_initializer = head_initializer
        self.skip_padding = skip_padding
        self.classifier_dropout = head_dropout
        self.classifier = head

    def get_config(self):
        return {**self._base_config(), "num_classes": self.num_classes, "dropout": self.dropout,
                "head_initializer": self.head_initializer, "skip_padding": self.skip_padding}


@keras.saving.register_keras_serializable(package="bert_keras")
class BertRegressor(_TaskModel):
    """Sentence (or sentence-pair) regression (STS-B's similarity, a rating): Dense(1) on
    the pooled [CLS] vector, trained with mean squared error.

    transformers' BertForSequenceClassification with num_labels=1 (problem_type
    "regression"): the same layers and weights (the head is named `classifier` too), its
    logits[:, 0] is `score`.

    Inputs: the encoder's dict of int32 [B, S] tensors (pairs as for `BertClassifier`).

    Outputs: {"score": float32 [B]}.

    Args:
      encoder: a `BertEncoder`; its weights are shared, not copied.
      dropout, head_initializer, skip_padding: as `BertClassifier`'s.
    """

    def __init__(self, encoder, dropout=0.1, head_initializer="normal", skip_padding=True,
                 **kwargs):
        _check_encoder(encoder, self, kwargs)
        inputs = dict(encoder.input)
        head_dropout, head, score = _pooled_head(encoder, inputs, 1, dropout,
                                                 head_initializer, skip_padding)
        super().__init__(inputs=inputs, outputs={"score": score[:, 0]}, **kwargs)  # [B]

        self.encoder = encoder
        self.dropout = dropout
        self.head_initializer = head_initializer
        self.skip_padding = skip_padding
        self.classifier_dropout = head_dropout
        self.classifier = head

    def get_config(self):
        return {**self._base_config(), "dropout": self.dropout,
                "head_initializer": self.head_initializer, "skip_padding": self.skip_padding}


@keras.saving.register_keras_serializable(package="bert_keras")
class BertTagger(_TaskModel):
    """Token tagger (POS, NER): Dense(C) on every token of the last layer (no pooler).

    Inputs: the encoder's dict of int32 [B, S] tensors.

    Outputs: {"logits": float32 [B, S, C]}. Only the first sub-token of each word carries a
    label in training data (`data_prep.tagging`); the loss ignores the others (label -1).

    Args:
      encoder: a `BertEncoder`; its weights are shared, not copied.
      num_classes: C, the number of tags.
      dropout: dropout rate on the sequence output.
      head_initializer: "normal" or "truncated_normal" (Google's), for the head's kernel
        (std: the encoder's initializer_range; see `HEAD_INITIALIZERS`).
      skip_padding: in training, run the encoder's layers on real tokens only (see
        `bert_keras.layers.padding_free`): the same loss and gradients as long as padded
        positions carry the ignored label -1 (as `data_prep.tagging` writes them), less
        work when sentences are shorter than S. False runs the padded computation.
        Inference is padded either way.
    """

    reads_pooler = False

    def __init__(self, encoder, num_classes, dropout=0.1, head_initializer="normal",
                 skip_padding=True, **kwargs):
        _check_encoder(encoder, self, kwargs)
        _check_num_classes(num_classes)
        _check_dropout(dropout)
        _check_head_initializer(head_initializer)
        _check_skip_padding(skip_padding)
        head_dropout = keras.layers.Dropout(dropout, dtype=encoder.layers_dtype_policy, name="tagger_dropout")
        head = Dense(
            num_classes,
            kernel_initializer=_initializer(encoder, head_initializer),
            dtype=encoder.layers_dtype_policy,
            name="tagger",
        )

        inputs = dict(encoder.input)
        sequence = encoder.sequence_output_only(inputs, skip_padding=skip_padding)  # [B, S, H]
        logits = ops.cast(head(head_dropout(sequence)), "float32")  # [B, S, C]
        super().__init__(inputs=inputs, outputs={"logits": logits}, **kwargs)

        self.encoder = encoder
        self.num_classes = num_classes
        self.dropout = dropout
        self.head_initializer = head_initializer
        self.skip_padding = skip_padding
        self.tagger_dropout = head_dropout
        self.tagger = head

    def get_config(self):
        return {**self._base_config(), "num_classes": self.num_classes, "dropout": self.dropout,
                "head_initializer": self.head_initializer, "skip_padding": self.skip_padding}


@keras.saving.register_keras_serializable(package="bert_keras")
class BertSpanQA(_TaskModel):
    """Extractive question answering (SQuAD): start and end logits for every token (no pooler).

    Inputs: the encoder's dict of int32 [B, S] tensors for "[CLS] question [SEP] context
    [SEP]" windows (see `data_prep.squad`).

    Outputs: {"start_logits": float32 [B, S], "end_logits": float32 [B, S]}. As in Google's
    run_squad.py there is no masking here: training targets never point at padding and the
    postprocessing only considers context tokens (and [CLS] = "no answer" for SQuAD v2).

    Args:
      encoder: a `BertEncoder`; its weights are shared, not copied.
      head_initializer: "normal" or "truncated_normal" (Google's), for the head's kernel
        (std: the encoder's initializer_range; see `HEAD_INITIALIZERS`).
    """

    reads_pooler = False

    def __init__(self, encoder, head_initializer="normal", **kwargs):
        _check_encoder(encoder, self, kwargs)
        _check_head_initializer(head_initializer)
        head = Dense(
            2,
            kernel_initializer=_initializer(encoder, head_initializer),
            dtype=encoder.layers_dtype_policy,
            name="span_logits",  # Google's cls/squad/output_weights [2, H] (transposed).
        )

        inputs = dict(encoder.input)
        sequence = encoder.sequence_output_only(inputs)  # [B, S, H], no pooler
        logits = ops.cast(head(sequence), "float32")  # [B, S, 2]
        start_logits = keras.layers.Identity(name="start_logits")(logits[..., 0])  # [B, S]
        end_logits = keras.layers.Identity(name="end_logits")(logits[..., 1])  # [B, S]
        super().__init__(
            inputs=inputs,
            outputs={"start_logits": start_logits, "end_logits": end_logits},
            **kwargs,
        )
        self.encoder = encoder
        self.head_initializer = head_initializer
        self.span_logits = head

    def get_config(self):
        return {**self._base_config(), "head_initializer": self.head_initializer}


def with_skip_padding(model, skip_padding):
    """`model` if its `skip_padding` is `skip_padding`, else a copy built with it (same
    weights; the setting is part of a task model's graph)."""
    _check_skip_padding(skip_padding)
    if model.skip_padding == skip_padding:
        return model
    copy = type(model).from_config({**model.get_config(), "skip_padding": skip_padding})
    copy.set_weights(model.get_weights())
    return copy


def with_dtype_policy(model, dtype):
    """`model` (a BertEncoder or a task model) if its layers compute under the Keras dtype
    policy `dtype` already, else a copy built under it, with the same weights.

    For training under mixed precision without touching Keras' global policy: under
    "mixed_bfloat16" ("mixed_float16") the encoder's and the head's layers compute in
    bfloat16 (float16), their variables stay float32 and the task logits float32. A model's
    config does not record the policy (Keras keeps a functional model's own policy at the
    global one, `BertEncoder.layers_dtype_policy`), so the model.keras of a mixed model
    loads as float32 with the same weights, and a copy made from its config (Keras'
    `from_config`, `with_skip_padding`) is float32 unless made again with this function.
    """
    encoder = model if isinstance(model, BertEncoder) else model.encoder
    if encoder.layers_dtype_policy.name == dtype:
        return model
    return _rebuilt(model, dtype=dtype)


def copy_of(model):
    """A copy of `model` (a BertEncoder or a task model) made from its config: the same
    weights, dtype policy and dropout seeds (its SeedGenerators' states), so it trains as
    `model` would. Made under a distribution's scope, its variables are the distribution's
    (the fine-tuning runner builds and loads models outside it first)."""
    encoder = model if isinstance(model, BertEncoder) else model.encoder
    return _rebuilt(model, dtype=encoder.layers_dtype_policy.name)


def _rebuilt(model, **encoder_config):
    """A copy of `model` (a BertEncoder or a task model) made from its config with
    `encoder_config` overriding the encoder's, the same weights (a Dense kernel transposed
    where the copy's `kernel_layout` differs; cast to the copy's variable dtype) and the
    same states of its dropout layers' SeedGenerators."""
    config = model.get_config()
    if isinstance(model, BertEncoder):
        copy = BertEncoder.from_config({**config, **encoder_config})
    else:
        encoder = dict(config["encoder"], config={**config["encoder"]["config"],
                                                  **encoder_config})
        copy = type(model).from_config({**config, "encoder": encoder})
    layouts, copy_layouts = _kernel_layouts(model), _kernel_layouts(copy)
    values = []
    for source, target in zip(model.weights, copy.weights):
        value = keras.ops.convert_to_numpy(source)
        if layouts.get(id(source), "in_out") != copy_layouts.get(id(target), "in_out"):
            value = value.T
        values.append(value)
    copy.set_weights(values)
    weights = {id(v) for v in model.weights} | {id(v) for v in copy.weights}
    seeds = [[v for v in m.variables if id(v) not in weights] for m in (model, copy)]
    for source, target in zip(*seeds, strict=True):
        target.assign(keras.ops.convert_to_numpy(source))
    return copy


SERVING_DTYPES = ("float32", "bfloat16")


def for_serving(model, dtype, kernel_layout="in_out"):
    """A copy of a task model for serving exports: its encoder built under `dtype`, its
    Dense kernels stored `kernel_layout`, attention's softmax written out
    (`explicit_softmax`), the same weights (kernels transposed where the layout differs;
    rounded to `dtype`). `model` itself if it is one already. Only an "in_out" copy's
    kernels are what training and checkpoints read and write.

    Kernel layout (`bert_keras.layers.dense.Dense`): "in_out" ([in, out], the trained
    model's) or "out_in" ([out, in], torch's nn.Linear's), whose products TensorFlow's
    oneDNN runs faster at 16 rows and slower from 32 rows on ([3072, 768] products
    1.10-1.34x slower; `bench/bench_small_matmul.py`). On real requests end to end the
    "in_out" exports took 0.87-0.95x the "out_in" ones' p50 (classifier, tagger, span QA;
    BUILD_NOTES.md section 8.11), hence the default.
    Attention: on TensorFlow without XLA, `keras.ops.dot_product_attention` selects over
    the [B, N, Q, S] scores with a broadcast boolean mask; the explicit softmax's additive
    mask took 0.70-0.80x its time at 192-384 positions.

    "bfloat16" is Keras' pure bfloat16 policy: every variable is stored in bfloat16 (half
    the bytes a request reads) and the matmuls run in bfloat16 (AMX / AVX512-BF16 on recent
    Intel Xeons, where a CPU at batch 1 mostly waits on the weights); LayerNorm statistics,
    the attention softmax and the logits stay float32, as under mixed precision. Outputs
    differ from float32 by bfloat16 rounding (about 1e-2 of the logits' scale), not float32
    noise.

    Raises:
      ValueError: a dtype other than SERVING_DTYPES, a layout other than KERNEL_LAYOUTS.
    """
    if dtype not in SERVING_DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(SERVING_DTYPES)}")
    if kernel_layout not in KERNEL_LAYOUTS:
        raise ValueError(f"kernel_layout {kernel_layout!r}: expected one of "
                         f"{', '.join(KERNEL_LAYOUTS)}")
    encoder = model.encoder
    if (encoder.layers_dtype_policy.name == dtype and encoder.kernel_layout == kernel_layout
            and encoder.explicit_softmax):
        return model
    return _rebuilt(model, dtype=dtype, kernel_layout=kernel_layout, explicit_softmax=True)


def _kernel_layouts(model) -> dict:
    """id(kernel variable) -> its Dense layer's kernel_layout, for every Dense in `model`."""
    return {id(layer._kernel): layer.kernel_layout for layer in model._flatten_layers()
            if isinstance(layer, Dense) and getattr(layer, "_kernel", None) is not None}


def averages_over_tokens(model) -> bool:
    """Whether `model`'s loss (`compile_args`) is a mean over a batch's labelled tokens
    rather than over its examples: the tagger's. Gradient accumulation averages such a loss
    exactly only with `compile_args(model, token_weighted=True)` and the weights
    `finetuning.loop.weigh_labelled_tokens` gives."""
    return isinstance(model, BertTagger)


def compile_args(model, token_weighted=False):
    """The `compile` arguments (loss, loss_weights, metrics) for a task model's dict outputs.

    Classification: sparse softmax cross-entropy on "logits" with labels int32 [B]; accuracy.
    Regression: mean squared error on "score" with float32 targets [B]; mean absolute error.
    Tagging: the same on labels int32 [B, S] with label -1 ignored, averaged over labelled
    tokens only; token accuracy over labelled tokens.
    Span QA: cross-entropy of the start and of the end position (int32 [B]), averaged as in
    Google's run_squad.py: (start + end) / 2.

    Args:
      token_weighted: tagging only (`averages_over_tokens`): the loss is instead the sum
        over labelled tokens of cross-entropy x sample weight, float32 [B], that the data
        gives (k / N under gradient accumulation, N the labelled tokens of the update's k
        micro-batches: `finetuning.loop.weigh_labelled_tokens`), so the mean of the k
        micro-batch losses, and of their gradients, is the update's token mean. The token
        accuracy is not weighted.

    Usage: `model.compile(optimizer=..., **compile_args(model))`.
    """
    if token_weighted and not averages_over_tokens(model):
        raise ValueError("compile_args: token_weighted applies to a BertTagger's loss only. "
                         f"Received: {type(model).__name__}")
    xent = lambda **kw: keras.losses.SparseCategoricalCrossentropy(from_logits=True, **kw)  # noqa: E731
    if isinstance(model, BertClassifier):
        return {"loss": {"logits": xent()},
                "metrics": {"logits": [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]}}
    if isinstance(model, BertRegressor):
        # transformers' regression loss (MSELoss on logits.squeeze()).
        return {"loss": {"score": keras.losses.MeanSquaredError()},
                "metrics": {"score": [keras.metrics.MeanAbsoluteError(name="mae")]}}
    if isinstance(model, BertTagger):
        # Keras masks ignored labels and divides by the number of kept ones (checked
        # against a numpy reference in tests/test_tasks.py); with "sum" it adds the kept
        # ones, each times its sample weight.
        reduction = {"reduction": "sum"} if token_weighted else {}
        return {"loss": {"logits": xent(ignore_class=IGNORE_LABEL, **reduction)},
                "metrics": {"logits": [MaskedSparseCategoricalAccuracy()]}}
    if isinstance(model, BertSpanQA):
        return {"loss": {"start_logits": xent(), "end_logits": xent()},
                "loss_weights": {"start_logits": 0.5, "end_logits": 0.5}}
    raise ValueError("compile_args needs a BertClassifier, BertRegressor, BertTagger or "
                     "BertSpanQA. "
                     f"Received: {type(model).__name__}")


@keras.saving.register_keras_serializable(package="bert_keras")
class MaskedSparseCategoricalAccuracy(keras.metrics.Mean):
    """Token accuracy over labels that are not `ignore_label` (y_true int [B, S], logits [B, S, C])."""

    def __init__(self, ignore_label=IGNORE_LABEL, name="token_accuracy", dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.ignore_label = ignore_label

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "int32")
        keep = ops.cast(ops.not_equal(y_true, self.ignore_label), "float32")
        correct = ops.cast(ops.equal(ops.cast(ops.argmax(y_pred, axis=-1), "int32"), y_true), "float32")
        return super().update_state(correct, sample_weight=keep)

    def get_config(self):
        return {"name": self.name, "ignore_label": self.ignore_label, "dtype": self.dtype}
