"""keras-hub presets: keras-hub's BERT (BertBackbone, BertMaskedLM, BertTextClassifier,
BertTokenizer) in and out of our models, through keras-hub's own from_preset and
save_to_preset.

A preset is a directory: config.json (the backbone's Keras config) + model.weights.h5,
metadata.json, tokenizer.json + assets/tokenizer/vocabulary.txt, and for a task
task.json + task.weights.h5. (Hugging Face's directories also hold a config.json; theirs
sit beside model.safetensors, a preset's beside model.weights.h5.)

keras-hub builds what we build, with other names and the attention kernels split by head
([H, A, H/A] where ours are [H, H]), and with computations fixed in its code, not in its
config:
  - the encoder's feed-forward GELU is the tanh approximation: ours "gelu_tanh";
  - every LayerNorm epsilon in the encoder is 1e-12 (ours: layer_norm_eps);
  - BertMaskedLM's transform computes the exact GELU with LayerNorm epsilon 1e-5, whatever
    the encoder's (ours: BertPretrainer's masked_lm_activation and
    masked_lm_layer_norm_epsilon), output tied to the word embeddings as ours; it has no
    next-sentence head;
  - BertTextClassifier is dropout + Dense(num_classes) on pooled_output: our
    BertClassifier, where its `activation` is None (logits).
One `dropout` serves the embeddings, every sublayer and the attention probabilities
(ours: hidden_dropout_prob and attention_probs_dropout_prob); its initializers are BERT's
(std 0.02). What keras-hub cannot compute is refused, or said in a warning where it is the
approximation keras-hub's own presets of Google's checkpoints make (exact GELU -> tanh).

The name table is the other formats' (`checkpoints.WeightName`, column `keras_hub`, its
attention rows split by head as Model Garden's are); weights are copied by it, all or
nothing, every missing, unexpected or mis-shaped weight listed. keras-hub (a dev
requirement) is imported only here, when a preset is read or written.
"""

from __future__ import annotations

import os

import numpy as np
from absl import logging

from bert_keras import checkpoints
from bert_keras.checkpoints import WeightLoadError
from bert_keras.config import BertConfig, ConfigError
from bert_keras.encoder import BertEncoder
from bert_keras.pretrainer import BertPretrainer
from bert_keras.tasks import BertClassifier
from data_prep import files
from data_prep.tokenizer_config import TokenizerConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
TASK_FILE = "task.json"
TASK_WEIGHTS_FILE = "task.weights.h5"
TOKENIZER_FILE = "tokenizer.json"
VOCABULARY_FILE = os.path.join("assets", "tokenizer", "vocabulary.txt")
# The name table's column of keras-hub's weight paths (checkpoints.WeightName.keras_hub).
FORMAT = "keras_hub"

BACKBONE = "keras_hub>BertBackbone"
MASKED_LM = "keras_hub>BertMaskedLM"
CLASSIFIER = "keras_hub>BertTextClassifier"
TOKENIZER = "keras_hub>BertTokenizer"

# What keras-hub's BERT code computes, whatever its config says (bert_backbone.py,
# bert_masked_lm.py: TransformerEncoder(activation=gelu_approximate, layer_norm_epsilon=
# 1e-12), MaskedLMHead(intermediate_activation="gelu") with its default epsilon 1e-5).
ENCODER_ACTIVATION = "gelu_tanh"
TANH_GELUS = ("gelu_tanh", "gelu_new", "gelu_pytorch_tanh")
LAYER_NORM_EPS = 1e-12
MLM_ACTIVATION = "gelu"
MLM_LAYER_NORM_EPS = 1e-5
INITIALIZER_RANGE = 0.02

def _keras_hub():
    """keras_hub, or a one-line error saying how to get it."""
    try:
        import keras_hub
    except ImportError as e:
        raise WeightLoadError(f"the keras_hub format needs keras-hub, which cannot be imported "
                              f"({e}); pip install keras-hub (see requirements-dev.txt)"
                              ) from None
    return keras_hub


def _copy(ours_model, theirs: list, heads: int, to_ours: bool, source: str,
          allow_unused: bool = False, left_out: frozenset = frozenset()) -> None:
    """Copies weights between our model and keras-hub's by the name table's `keras_hub`
    column (`checkpoints.WeightName`), all or nothing.

    Args:
      ours_model: our encoder, pretrainer or classifier.
      theirs: keras-hub's weights (Keras variables; the backbone's and the task head's).
      heads: attention heads, for the rows split by head.
      to_ours: the direction.
      source: the preset (or output), for messages.
      allow_unused: keras-hub weights without a row may stay behind (a head the caller
        asked to leave out).
      left_out: our variables not copied (the NSP head, which keras-hub has no place for).

    Raises:
      WeightLoadError: naming every weight missing on either side or of the wrong shape.
    """
    import keras

    rows = checkpoints.model_weight_names(ours_model)  # every variable of ours is in it
    ours = {v.path: v for v in ours_model.weights}
    their = {v.path: v for v in theirs}
    pairs, missing, unnamed = [], [], []
    for row in rows:
        if row.ours in left_out:
            continue
        name = row.name(FORMAT)
        if not name:
            unnamed.append(row.ours)
        elif name not in their:
            missing.append(name)
        else:
            pairs.append((ours[row.ours], their[name],
                          row.file_shape(FORMAT, tuple(ours[row.ours].shape), heads)))
    used = {t.path for _, t, _ in pairs}
    unexpected = [] if allow_unused else sorted(set(their) - used)
    if unnamed or missing or unexpected:
        lines = ([f"ours without a keras-hub name: {', '.join(unnamed)}"] if unnamed else []) + \
                ([f"missing {len(missing)}: {', '.join(missing)}"] if missing else []) + \
                ([f"unexpected {len(unexpected)}: {', '.join(unexpected)}"] if unexpected else [])
        raise WeightLoadError(f"{source}: weights do not match a {type(ours_model).__name__}:"
                              "\n  " + "\n  ".join(lines))
    mismatched = [f"{t.path}: keras-hub {tuple(t.shape)}, ours {tuple(o.shape)} (expected "
                  f"{expected})" for o, t, expected in pairs if tuple(t.shape) != expected]
    if mismatched:
        raise WeightLoadError(f"{source}: {len(mismatched)} weight(s) have the wrong shape:\n  "
                              + "\n  ".join(mismatched))
    values = [(o, t, np.asarray(keras.ops.convert_to_numpy((t if to_ours else o).value),
                                dtype=np.float32)) for o, t, _ in pairs]
    for o, t, value in values:  # every value read before any is assigned
        target = o if to_ours else t
        # The rows split by head are a reshape either way (no keras-hub weight is
        # transposed): the bytes keep their order.
        target.assign(value.reshape(tuple(target.shape)).astype(target.dtype))


# ------------------------------------------------------------------------------------------
# Reading


def is_keras_hub_preset(path: str) -> bool:
    """Whether `path` is a directory keras-hub's save_to_preset wrote (config.json beside
    model.weights.h5)."""
    return all(os.path.isfile(os.path.join(path, name)) for name in (CONFIG_FILE, WEIGHTS_FILE))


def _registered_name(path: str, name: str) -> str:
    """The `registered_name` (e.g. "keras_hub>BertBackbone") in a preset's JSON file."""
    try:
        values = files.read_json(path)
    except files.TextFileError as e:
        raise WeightLoadError(str(e)) from None
    if not isinstance(values, dict) or not isinstance(values.get("registered_name"), str):
        raise WeightLoadError(f"{path}: expected keras-hub's {name} (a JSON object with "
                              "\"registered_name\")")
    return values["registered_name"]


# BertBackbone's settings (its constructor's arguments), and Keras' own.
_BACKBONE_INTEGERS = ("vocabulary_size", "num_layers", "num_heads", "hidden_dim",
                      "intermediate_dim", "max_sequence_length", "num_segments")
_BACKBONE_KEYS = frozenset(_BACKBONE_INTEGERS + ("dropout", "name", "trainable", "dtype"))


def _check_backbone_config(config_file: str) -> None:
    """Refuses, in one line naming the key, a config.json keras-hub would build otherwise
    than it says (it passes a key BertBackbone does not take, such as a hand-written
    "activation", to Keras, which ignores it) or would fail on with a long message."""
    try:
        values = files.read_json(config_file)
    except files.TextFileError as e:
        raise WeightLoadError(str(e)) from None
    inner = values.get("config") if isinstance(values, dict) else None
    if not isinstance(inner, dict):
        raise WeightLoadError(f"{config_file}: expected keras-hub's backbone config, a JSON "
                              "object with a \"config\" object")
    unknown = sorted(set(inner) - _BACKBONE_KEYS)
    if unknown:
        raise WeightLoadError(
            f"{config_file}: unknown BertBackbone setting(s) {', '.join(unknown)} (it takes "
            f"{', '.join(_BACKBONE_INTEGERS)} and dropout; its activation and LayerNorm "
            "epsilon are fixed in keras-hub's code)")
    for key in _BACKBONE_INTEGERS:
        value = inner.get(key)
        if key in inner and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise WeightLoadError(f"{config_file}: {key} is {value!r}; expected a positive "
                                  "integer")
    if isinstance(inner.get("hidden_dim"), int) and isinstance(inner.get("num_heads"), int) \
            and inner["hidden_dim"] % inner["num_heads"]:
        raise WeightLoadError(f"{config_file}: hidden_dim {inner['hidden_dim']} is not a "
                              f"multiple of num_heads {inner['num_heads']}")
    dropout = inner.get("dropout", 0.1)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise WeightLoadError(f"{config_file}: dropout is {dropout!r}; expected a probability "
                              "in [0, 1)")


def _short(registered: str) -> str:
    return registered.split(">")[-1]


def _from_preset(load, path: str, what: str):
    """keras-hub's from_preset, its errors in one line naming the preset."""
    try:
        return load()
    except Exception as e:  # noqa: BLE001 -- keras-hub, Keras and h5py errors alike
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise WeightLoadError(f"{path}: keras-hub cannot load its {what} ({message})") from None


def config_of_backbone(backbone, source: str) -> BertConfig:
    """Our BertConfig of a keras-hub BertBackbone (what its config says, and what its code
    fixes: the tanh GELU, epsilon 1e-12, initializer std 0.02)."""
    try:
        return BertConfig(
            vocab_size=backbone.vocabulary_size, hidden_size=backbone.hidden_dim,
            num_hidden_layers=backbone.num_layers, num_attention_heads=backbone.num_heads,
            intermediate_size=backbone.intermediate_dim, hidden_act=ENCODER_ACTIVATION,
            hidden_dropout_prob=backbone.dropout, attention_probs_dropout_prob=backbone.dropout,
            max_position_embeddings=backbone.max_sequence_length,
            type_vocab_size=backbone.num_segments, initializer_range=INITIALIZER_RANGE,
            layer_norm_eps=LAYER_NORM_EPS)
    except ConfigError as e:
        raise WeightLoadError(f"{source}: {e}") from None


def preset_task(path: str) -> str | None:
    """The task a preset holds ("keras_hub>BertMaskedLM", ...), or None for a backbone."""
    task = os.path.join(path, TASK_FILE)
    return _registered_name(task, "task.json") if os.path.isfile(task) else None


def read_keras_hub_model(path: str, want: str = "auto"):
    """Builds our model of a keras-hub BERT preset and copies its weights.

    Args:
      path: the preset directory.
      want: "auto": what the preset holds (a BertBackbone: a BertEncoder; a BertMaskedLM:
        a BertPretrainer without the next-sentence head, its masked-LM head computing as
        keras-hub's; a BertTextClassifier: a BertClassifier, no label names); "encoder":
        the backbone alone (a task head is left out); "pretrainer": a BertMaskedLM required.

    Raises:
      WeightLoadError: not a BERT preset, a task or setting ours cannot compute, a file
        keras-hub cannot load, weights that do not fit (every one named).
    """
    keras_hub = _keras_hub()
    config_file = os.path.join(path, CONFIG_FILE)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not os.path.isfile(os.path.join(path, name)):
            raise WeightLoadError(f"{path}: no {name}; a keras-hub preset holds {CONFIG_FILE} "
                                  f"and {WEIGHTS_FILE} (backbone.save_to_preset)")
    backbone_class = _registered_name(config_file, "backbone config")
    if backbone_class != BACKBONE:
        raise WeightLoadError(f"{config_file}: a {_short(backbone_class)} preset; the keras_hub "
                              "format reads BertBackbone presets (and BertMaskedLM or "
                              "BertTextClassifier tasks on one)")
    _check_backbone_config(config_file)
    task = preset_task(path) if want != "encoder" else None
    if task is not None and task not in (MASKED_LM, CLASSIFIER):
        raise WeightLoadError(f"{os.path.join(path, TASK_FILE)}: a {_short(task)} task, which "
                              "bert-keras has no model for (it reads BertMaskedLM and "
                              "BertTextClassifier); --model=encoder converts its backbone alone")
    if want == "pretrainer" and task != MASKED_LM:
        raise WeightLoadError(f"{path}: holds a {_short(task or BACKBONE)}, not a BertMaskedLM "
                              "(no pretraining head); use --model=encoder or --model=auto")
    if task is not None and not os.path.isfile(os.path.join(path, TASK_WEIGHTS_FILE)):
        raise WeightLoadError(f"{path}: {TASK_FILE} names a {_short(task)}, but there is no "
                              f"{TASK_WEIGHTS_FILE} (its head's weights); --model=encoder "
                              "converts the backbone alone")
    if task == MASKED_LM:
        theirs = _from_preset(lambda: keras_hub.models.BertMaskedLM.from_preset(
            path, preprocessor=None), path, "BertMaskedLM")
        backbone = theirs.backbone
    elif task == CLASSIFIER:
        theirs = _from_preset(lambda: keras_hub.models.BertTextClassifier.from_preset(
            path, preprocessor=None), path, "BertTextClassifier")
        backbone = theirs.backbone
        activation = getattr(theirs.activation, "__name__", str(theirs.activation))
        if activation != "linear":
            raise WeightLoadError(
                f"{os.path.join(path, TASK_FILE)}: the classifier's activation is "
                f"{activation!r}; a BertClassifier outputs logits (activation None), so it "
                "cannot compute it; --model=encoder converts the backbone alone")
    else:
        theirs = backbone = _from_preset(
            lambda: keras_hub.models.BertBackbone.from_preset(path), path, "BertBackbone")
    config = config_of_backbone(backbone, config_file)
    encoder = BertEncoder.from_bert_config(config)
    if task == MASKED_LM:
        ours = BertPretrainer(encoder, next_sentence=False, masked_lm_activation=MLM_ACTIVATION,
                              masked_lm_layer_norm_epsilon=MLM_LAYER_NORM_EPS)
    elif task == CLASSIFIER:
        ours = BertClassifier(encoder, theirs.num_classes, dropout=theirs.dropout)
    else:
        ours = encoder
    _copy(ours, list(theirs.weights), config.num_attention_heads, to_ours=True,
          source=path, allow_unused=want == "encoder")
    return ours


# Where keras-hub's BertTokenizer (keras_hub/src/tokenizers/word_piece_tokenizer.py,
# pretokenize) tokenizes otherwise than BERT's (Google's tokenization.py, transformers',
# ours); tests/test_keras_hub_presets.py pins each under every casing setting.
def tokenizer_difference(settings: TokenizerConfig) -> str:
    """What keras-hub's BertTokenizer does otherwise than BERT's under `settings` (a warning
    for a converted preset; each part pinned by tests/test_keras_hub_presets.py)."""
    parts = []
    if settings.do_lower_case:
        recomposed = (", and after stripping accents it recomposes Hangul that BERT leaves in "
                      "jamo" if settings.effective_strip_accents else "")
        parts.append("lowercases by NFKC case folding where BERT uses str.lower(), folding "
                     "compatibility characters (full-width letters, ligatures, \"ß\" -> \"ss\")"
                     f"{recomposed}")
    parts.append("splits words at a zero-width space, which BERT deletes")
    return "keras-hub's BertTokenizer " + "; it ".join(parts) + ". Other text gets the same ids"


# keras-hub tokenizer settings ours cannot follow: attribute -> (what ours does, why).
_TOKENIZER_FIXED = {
    "split": (True, "splits the text on whitespace and punctuation"),
    "suffix_indicator": ("##", "marks word pieces with ##"),
    "oov_token": ("[UNK]", "maps unknown words to [UNK]"),
    "special_tokens_in_strings": (False, "reads [CLS] or [MASK] typed in a text as text"),
}


def read_keras_hub_tokenizer(path: str) -> tuple[str, TokenizerConfig, str] | None:
    """(vocabulary file, tokenizer settings, tokenizer.json) of a preset's BertTokenizer,
    or None where the preset has no tokenizer.json.

    The vocabulary is keras-hub's assets/tokenizer/vocabulary.txt (one token a line, as
    vocab.txt); the settings: lowercase -> do_lower_case, strip_accents, split_on_cjk ->
    tokenize_chinese_chars.

    Raises:
      WeightLoadError: another tokenizer than BertTokenizer, a setting ours cannot follow,
        or a file keras-hub cannot load.
    """
    tokenizer_file = os.path.join(path, TOKENIZER_FILE)
    if not os.path.isfile(tokenizer_file):
        return None
    registered = _registered_name(tokenizer_file, "tokenizer config")
    if registered != TOKENIZER:
        raise WeightLoadError(f"{tokenizer_file}: a {_short(registered)}; BERT presets have a "
                              "BertTokenizer (WordPiece)")
    keras_hub = _keras_hub()
    tokenizer = _from_preset(lambda: keras_hub.models.BertTokenizer.from_preset(path), path,
                             "BertTokenizer")
    for name, (ours, what) in _TOKENIZER_FIXED.items():
        if getattr(tokenizer, name) != ours:
            raise WeightLoadError(f"{tokenizer_file}: {name} is {getattr(tokenizer, name)!r}; "
                                  f"bert-keras' tokenizer {what} ({name} {ours!r})")
    vocab = os.path.join(path, VOCABULARY_FILE)
    if not os.path.isfile(vocab):
        raise WeightLoadError(f"{tokenizer_file}: its vocabulary {vocab} is missing")
    settings = TokenizerConfig(do_lower_case=bool(tokenizer.lowercase),
                               strip_accents=bool(tokenizer.strip_accents),
                               tokenize_chinese_chars=bool(tokenizer.split_on_cjk))
    return vocab, settings, tokenizer_file


# ------------------------------------------------------------------------------------------
# Writing


def _check_writable_model(model, labels) -> list[str]:
    """What keras-hub computes otherwise than `model` (warnings to give), after refusing what
    it cannot compute at all.

    Raises:
      ValueError: a model keras-hub has no task for, an activation other than GELU, a
        LayerNorm epsilon other than 1e-12 in the encoder.
    """
    if not isinstance(model, (BertEncoder, BertPretrainer, BertClassifier)):
        raise ValueError(f"a {type(model).__name__} has no keras-hub BERT task (the keras_hub "
                         "format holds BertBackbone, BertMaskedLM and BertTextClassifier "
                         "presets); convert its encoder with --model=encoder")
    encoder = model if isinstance(model, BertEncoder) else model.encoder
    config = encoder.to_bert_config()
    notes = []
    if config.hidden_act not in TANH_GELUS + ("gelu",):
        raise ValueError(f"hidden_act {config.hidden_act!r}: keras-hub's BertBackbone computes "
                         "the GELU (tanh form) whatever its config says")
    if config.hidden_act == "gelu":
        notes.append("keras-hub's BertBackbone computes the tanh approximation of this exact "
                     "(erf) GELU, as keras-hub's own presets of Google's checkpoints do: "
                     "activations differ by at most 4.7e-4")
    if config.layer_norm_eps != LAYER_NORM_EPS:
        raise ValueError(f"layer_norm_eps {config.layer_norm_eps:g}: keras-hub's BertBackbone "
                         f"always uses {LAYER_NORM_EPS:g}")
    if config.attention_probs_dropout_prob != config.hidden_dropout_prob:
        notes.append(f"keras-hub has one dropout rate: attention_probs_dropout_prob "
                     f"{config.attention_probs_dropout_prob:g} becomes hidden_dropout_prob's "
                     f"{config.hidden_dropout_prob:g} (training only)")
    if isinstance(model, BertPretrainer):
        head = model.masked_lm
        if head.activation not in TANH_GELUS + ("gelu",):
            raise ValueError(f"the masked-LM head's activation {head.activation!r}: keras-hub's "
                             "BertMaskedLM computes the exact GELU; --model=encoder converts "
                             "the encoder alone")
        if head.activation != MLM_ACTIVATION or head.layer_norm_epsilon != MLM_LAYER_NORM_EPS:
            notes.append(f"keras-hub's BertMaskedLM computes its head with the exact GELU and "
                         f"LayerNorm epsilon {MLM_LAYER_NORM_EPS:g} (this one: "
                         f"{head.activation!r}, {head.layer_norm_epsilon:g}): its logits "
                         "differ slightly")
        if model.next_sentence:
            notes.append("the next-sentence head (nsp_dense) is left out: keras-hub's "
                         "BertMaskedLM has none (--model=encoder writes the backbone alone)")
    if isinstance(model, BertClassifier) and labels:
        notes.append(f"the label names ({', '.join(labels[:4])}{' ...' if len(labels) > 4 else ''})"
                     " are left out: a keras-hub preset has no place for them")
    return notes


def save_keras_hub_preset(model, directory: str, vocab_file: str | None = None,
                          settings: TokenizerConfig | None = None,
                          labels: list[str] | None = None) -> str:
    """Writes `model` as a keras-hub preset with keras-hub's save_to_preset: an encoder as
    a BertBackbone, a pretrainer as a BertMaskedLM, a classifier as a BertTextClassifier,
    with a BertTokenizer of `vocab_file` and `settings` where given, inside keras-hub's
    preprocessor for the task (BertTextClassifier's for a backbone). The directory is
    assembled under a temporary name and renamed; an existing one (unless empty) is refused.

    Raises:
      FileExistsError: the output exists; ValueError: what keras-hub cannot compute
        (`_check_writable_model`) or a tokenizer setting its tokenizer.json cannot record.
    """
    directory = os.path.abspath(os.fspath(directory))
    checkpoints.check_output_free("keras_hub", directory)
    for note in _check_writable_model(model, labels):
        logging.warning("%s: %s", directory, note)
    settings = settings or TokenizerConfig()
    if vocab_file:
        logging.warning("%s: %s", directory, tokenizer_difference(settings))
    if vocab_file and not settings.tokenize_chinese_chars:
        raise ValueError("tokenize_chinese_chars=false: keras-hub's BertTokenizer saves no "
                         "split_on_cjk in tokenizer.json (it always splits CJK ideographs)")
    keras_hub = _keras_hub()
    encoder = model if isinstance(model, BertEncoder) else model.encoder
    config = encoder.to_bert_config()
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size, num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads, hidden_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size, dropout=config.hidden_dropout_prob,
        max_sequence_length=config.max_position_embeddings,
        num_segments=config.type_vocab_size, dtype="float32")
    if isinstance(model, BertPretrainer):
        theirs = keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
        # The head's variables exist once it is built (keras-hub builds it on first call).
        theirs({"token_ids": np.zeros((1, 2), "int32"), "segment_ids": np.zeros((1, 2), "int32"),
                "padding_mask": np.ones((1, 2), "int32"),
                "mask_positions": np.zeros((1, 1), "int32")})
    elif isinstance(model, BertClassifier):
        theirs = keras_hub.models.BertTextClassifier(backbone, model.num_classes,
                                                     preprocessor=None, dropout=model.dropout)
    else:
        theirs = backbone
    nsp = isinstance(model, BertPretrainer) and model.next_sentence
    _copy(model, list(theirs.weights), config.num_attention_heads, to_ours=False,
          source=directory, left_out=frozenset(
              w.ours for w in checkpoints.NSP_WEIGHTS) if nsp else frozenset())
    tokenizer = None
    if vocab_file:
        try:
            tokenizer = keras_hub.models.BertTokenizer(
                vocabulary=vocab_file, lowercase=settings.do_lower_case,
                strip_accents=settings.effective_strip_accents)
        except ValueError as e:  # a vocabulary without [CLS], [SEP], [PAD] or [MASK]
            raise ValueError(f"{vocab_file}: keras-hub's BertTokenizer refuses it ({e})") from None
        # Every preset with its preprocessor, as keras-hub's are (from_preset then takes raw
        # text): keras-hub's 512 tokens, or fewer where the position table is shorter. A
        # backbone gets the classifier's (preprocessor.json), which
        # BertTextClassifier.from_preset(dir, num_classes=...) reads; without it keras-hub
        # packs to 512 tokens, which a shorter table cannot take (its fit failed).
        length = min(512, config.max_position_embeddings)
        preprocessor = (keras_hub.models.BertMaskedLMPreprocessor
                        if isinstance(model, BertPretrainer)
                        else keras_hub.models.BertTextClassifierPreprocessor)(
            tokenizer, sequence_length=length)
        if theirs is not backbone:
            theirs.preprocessor = preprocessor
        elif length < 512:
            # keras-hub makes a masked LM's preprocessor at 512 tokens whatever the preset
            # holds (it reads only a preprocessor.json of its own class).
            logging.warning(
                "%s: keras-hub's BertMaskedLM.from_preset on this backbone packs to 512 tokens, "
                "more than its %d positions: pass preprocessor=keras_hub.models."
                "BertMaskedLMPreprocessor.from_preset(%r, sequence_length=%d)", directory,
                config.max_position_embeddings, directory, length)
    with files.atomic_output(directory, overwrite=os.path.isdir(directory), directory=True,
                             hint="choose another directory") as tmp:
        theirs.save_to_preset(tmp)  # a task's preprocessor saves the tokenizer with it
        if tokenizer is not None and theirs is backbone:
            preprocessor.save_to_preset(tmp)  # preprocessor.json, tokenizer.json, assets
    return directory
