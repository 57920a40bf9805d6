"""BertConfig: the hyperparameters of a BERT encoder, in Google's bert_config.json terms.

Google's released checkpoints ship a `bert_config.json` whose keys are the field names
below (`layer_norm_eps` is ours and Hugging Face's; Google's files omit it and use 1e-12).
`from_json_file` / `to_json_file` read and write that format, so a config travels between
Google's code, Hugging Face and ours unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from data_prep.cli import ToolError


class ConfigError(ToolError):
    """A bert_config.json (or config values) that cannot make a model; the message names the
    file and the field."""


# Activations the feed-forward layer understands. "gelu" is the exact erf form (what Google's
# 2018 checkpoints were trained with and what Hugging Face calls "gelu"); "gelu_new",
# "gelu_tanh" and "gelu_pytorch_tanh" are the tanh approximation.
HIDDEN_ACTIVATIONS = ("gelu", "gelu_new", "gelu_tanh", "gelu_pytorch_tanh", "relu", "tanh")

# Every key of Google's released bert_config.json files. A file must have them all: a missing
# key silently taking a default is how a model ends up the wrong shape (a file without
# num_attention_heads took 12, and the error then blamed hidden_size). `layer_norm_eps` is
# ours and Hugging Face's; Google's files omit it (1e-12).
REQUIRED_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "intermediate_size", "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob",
    "max_position_embeddings", "type_vocab_size", "initializer_range",
)

# Bytes of memory per parameter when training with Adam-style optimizers: float32 weights,
# gradients and the two moment slots (4 x 4 bytes). Activations come on top.
TRAINING_BYTES_PER_PARAMETER = 16

# Keys found in some of Google's released bert_config.json files (the multilingual and
# Chinese models) that describe nothing this encoder has: the pooler in those models is the
# standard [CLS] dense + tanh. They are accepted and dropped; every other unknown key is an
# error, because a misspelled key silently falling back to a default is how a model ends up
# the wrong size.
_IGNORED_GOOGLE_KEYS = frozenset(
    {
        "directionality",
        "pooler_fc_size",
        "pooler_num_attention_heads",
        "pooler_num_fc_layers",
        "pooler_size_per_head",
        "pooler_type",
    }
)


# transformers config.json keys whose other values make another model than BERT's encoder:
# key -> the values that are BERT's (the first one its default).
_TRANSFORMERS_PLAIN_BERT = {"is_decoder": (False, None), "add_cross_attention": (False, None),
                            "position_embedding_type": ("absolute", None)}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Hyperparameters of a BERT encoder (Google's bert_config.json keys).

    Defaults are BERT-base, uncased English vocabulary.
    """

    vocab_size: int = 30522  # WordPiece vocabulary size of Google's English models.
    hidden_size: int = 768  # H: width of every token vector.
    num_hidden_layers: int = 12  # L: transformer blocks.
    num_attention_heads: int = 12  # A: heads; hidden_size must divide by it.
    intermediate_size: int = 3072  # Feed-forward width; 4H in every released model.
    hidden_act: str = "gelu"  # Feed-forward activation (see HIDDEN_ACTIVATIONS).
    hidden_dropout_prob: float = 0.1  # Dropout on embeddings and every sublayer output.
    attention_probs_dropout_prob: float = 0.1  # Dropout on attention probabilities.
    max_position_embeddings: int = 512  # Longest sequence the position table covers.
    type_vocab_size: int = 2  # Segment ids: 0 for sentence A, 1 for sentence B.
    initializer_range: float = 0.02  # Stddev of the truncated-normal initializer.
    layer_norm_eps: float = 1e-12  # Google's value; Hugging Face's configs say the same.

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(
                    f"BertConfig.{name} must be a positive integer. Received: {name}={value!r}"
                )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
                raise ConfigError(
                    f"BertConfig.{name} must be a probability in [0, 1). Received: {name}={value!r}"
                )
        for name in ("initializer_range", "layer_norm_eps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ConfigError(
                    f"BertConfig.{name} must be a positive number. Received: {name}={value!r}"
                )
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                "BertConfig.hidden_size must be divisible by num_attention_heads. Received: "
                f"hidden_size={self.hidden_size}, num_attention_heads={self.num_attention_heads}"
            )
        if self.hidden_act not in HIDDEN_ACTIVATIONS:
            raise ConfigError(
                f"BertConfig.hidden_act must be one of {HIDDEN_ACTIVATIONS}. "
                f"Received: hidden_act={self.hidden_act!r}"
            )

    @property
    def head_size(self) -> int:
        """Width of one attention head, hidden_size / num_attention_heads."""
        return self.hidden_size // self.num_attention_heads

    # ----------------------------------------------------------------------------------
    # dict / JSON

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config",
                  require_all: bool = False) -> "BertConfig":
        """Builds a config from a bert_config.json-style dict.

        Args:
          values: mapping of Google's bert_config.json keys to values.
          source: what the dict came from, used in error messages (e.g. a file path).
          require_all: every key of `REQUIRED_KEYS` must be present (a bert_config.json
            file); otherwise missing keys take the defaults (presets, overrides).

        Raises:
          ValueError: a key is unknown or missing or a value is invalid; the message names
            the key.
        """
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(values).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known - _IGNORED_GOOGLE_KEYS)
        if unknown:
            raise ConfigError(
                f"{source}: unknown BertConfig key(s) {unknown}. Known keys: {sorted(known)}"
            )
        missing = [k for k in REQUIRED_KEYS if k not in values] if require_all else []
        if missing:
            raise ConfigError(
                f"{source}: missing key(s) {missing}; a bert_config.json must give every one "
                f"of {list(REQUIRED_KEYS)} (only layer_norm_eps may be left out, for 1e-12)"
            )
        kwargs = {k: v for k, v in values.items() if k in known}
        try:
            return cls(**kwargs)
        except ValueError as e:
            raise ConfigError(f"{source}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """Returns the config as a plain dict with bert_config.json keys."""
        return dataclasses.asdict(self)

    @classmethod
    def from_transformers_dict(cls, values: dict[str, Any], source: str = "config"
                               ) -> "BertConfig":
        """Builds a config from a transformers BERT config.json's dict. Its BERT keys have
        Google's names; the generic ones (architectures, torch_dtype, ...) are dropped, and
        keys it leaves out take transformers' defaults, which are BERT-base's, as here."""
        model_type = values.get("model_type", "bert")
        if model_type != "bert":
            raise ConfigError(f"{source}: model_type is {model_type!r}, expected 'bert'")
        # Settings that change what the weights compute, which BERT's encoder does not do:
        # dropping them would convert a different model without a word.
        unlike = [f"{key}={values[key]!r}" for key, plain in _TRANSFORMERS_PLAIN_BERT.items()
                  if values.get(key, plain[0]) not in plain]
        if unlike:
            raise ConfigError(
                f"{source}: {', '.join(unlike)}; bert-keras builds BERT's bidirectional "
                "encoder with absolute positions (is_decoder and add_cross_attention false, "
                "position_embedding_type absolute)")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls.from_dict({k: v for k, v in values.items() if k in known}, source=source)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "BertConfig":
        """Reads a Google-style bert_config.json (every key of `REQUIRED_KEYS` present), or
        transformers' config.json (it names a `model_type`; `from_transformers_dict`)."""
        path = os.fspath(path)
        from data_prep import files

        try:
            values = files.read_json(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"BERT config file not found: {path}") from None
        except files.TextFileError as e:  # not UTF-8 text, or not JSON: the line named
            raise ConfigError(str(e)) from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a JSON object of bert_config.json keys")
        if "model_type" in values:
            return cls.from_transformers_dict(values, source=path)
        return cls.from_dict(values, source=path, require_all=True)

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def to_json_file(self, path: str | os.PathLike, overwrite: bool = False) -> None:
        """Writes the config as bert_config.json (atomically; refuses to overwrite)."""
        from data_prep import files

        files.write_text(os.fspath(path), self.to_json_string(), overwrite=overwrite,
                         hint="pass overwrite=True to replace it")

    # ----------------------------------------------------------------------------------
    # size

    def parameter_counts(self, pretraining_heads: bool = False) -> dict[str, int]:
        """Parameters by the config field that scales them (they sum to the model's count).

        Keys: "vocab_size" (word embeddings, and the MLM output bias with heads),
        "max_position_embeddings", "type_vocab_size", "num_hidden_layers" (the transformer
        blocks), "hidden_size" (embedding LayerNorm, pooler, MLM transform and NSP head).
        `sum(...)` equals `count_params()` of BertEncoder (with the pooler) or, with
        `pretraining_heads`, of BertPretrainer: BERT-base 109,482,240 / 110,106,428.
        """
        h, i = self.hidden_size, self.intermediate_size
        block = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * 2 * h
        counts = {
            "vocab_size": self.vocab_size * h,
            "max_position_embeddings": self.max_position_embeddings * h,
            "type_vocab_size": self.type_vocab_size * h,
            "num_hidden_layers": self.num_hidden_layers * block,
            "hidden_size": 2 * h + (h * h + h),  # embedding LayerNorm, pooler
        }
        if pretraining_heads:
            counts["vocab_size"] += self.vocab_size  # MLM output bias (the matrix is tied)
            counts["hidden_size"] += (h * h + h) + 2 * h + (2 * h + 2)  # transform, LN, NSP
        return counts

    def check_fits_memory(self, available_bytes: int | None = None,
                          bytes_per_parameter: int = TRAINING_BYTES_PER_PARAMETER,
                          pretraining_heads: bool = True, source: str = "config") -> int:
        """Refuses a model whose training state alone cannot fit the available memory.

        Weights, gradients and Adam's two slots need `bytes_per_parameter` (16) bytes per
        parameter before any activation; a config asking for more than the machine has
        would otherwise fail deep inside TensorFlow (a ResourceExhaustedError while
        initialising the embedding).

        Args:
          available_bytes: memory to compare with; None measures it
            (`available_memory_bytes`); when that is unknown nothing is checked.
          bytes_per_parameter: 16 for training with Adam; 4 for inference.
          pretraining_heads: count the MLM/NSP heads too.
          source: the config's file, named in the error.

        Returns:
          The estimated bytes.

        Raises:
          ValueError: one line naming the field that makes the model largest, its value,
            the parameters and the memory needed and available.
        """
        counts = self.parameter_counts(pretraining_heads)
        total = sum(counts.values())
        needed = total * bytes_per_parameter
        if available_bytes is None:
            available_bytes = available_memory_bytes()
        if available_bytes is None or needed <= available_bytes:
            return needed
        field = max(counts, key=counts.get)
        raise ConfigError(
            f"{source}: {field}={getattr(self, field)} makes a model of {total:,} parameters "
            f"({100 * counts[field] / total:.0f}% from {field}), which needs at least "
            f"{_gib(needed)} for its weights, gradients and Adam's two slots "
            f"({bytes_per_parameter} bytes per parameter), but {_gib(available_bytes)} of "
            f"memory is available; reduce {field}"
        )

    # ----------------------------------------------------------------------------------
    # presets

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "BertConfig":
        """Returns one of the released BERT sizes (Turc et al. 2019 for the small ones).

        Args:
          name: one of `PRESETS` ("tiny", "mini", "small", "medium", "base", "large").
          **overrides: fields to change, e.g. `vocab_size=8000` for an own vocabulary.
        """
        if name not in PRESETS:
            raise ConfigError(f"Unknown BERT preset {name!r}. Available: {sorted(PRESETS)}")
        layers, hidden, heads = PRESETS[name]
        values = dict(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
        )
        values.update(overrides)
        return cls.from_dict(values, source=f"preset {name!r}")


# name -> (num_hidden_layers L, hidden_size H, num_attention_heads A); intermediate is 4H.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def available_memory_bytes() -> int | None:
    """Memory this process can still get: the smaller of the system's available memory
    (/proc/meminfo MemAvailable, else free pages) and the cgroup limit left; None if unknown.
    """
    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    if not found:
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError, AttributeError):
            pass
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file, encoding="ascii") as f:
                limit = f.read().strip()
            with open(usage_file, encoding="ascii") as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:  # "max" / huge values: no limit
            found.append(max(0, int(limit) - usage))
        break
    return min(found) if found else None
