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

# Activations the feed-forward layer understands. "gelu" is the exact erf form (what Google's
# 2018 checkpoints were trained with and what Hugging Face calls "gelu"); "gelu_new",
# "gelu_tanh" and "gelu_pytorch_tanh" are the tanh approximation.
HIDDEN_ACTIVATIONS = ("gelu", "gelu_new", "gelu_tanh", "gelu_pytorch_tanh", "relu", "tanh")

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
                raise ValueError(
                    f"BertConfig.{name} must be a positive integer. Received: {name}={value!r}"
                )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
                raise ValueError(
                    f"BertConfig.{name} must be a probability in [0, 1). Received: {name}={value!r}"
                )
        for name in ("initializer_range", "layer_norm_eps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(
                    f"BertConfig.{name} must be a positive number. Received: {name}={value!r}"
                )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                "BertConfig.hidden_size must be divisible by num_attention_heads. Received: "
                f"hidden_size={self.hidden_size}, num_attention_heads={self.num_attention_heads}"
            )
        if self.hidden_act not in HIDDEN_ACTIVATIONS:
            raise ValueError(
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
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> "BertConfig":
        """Builds a config from a bert_config.json-style dict.

        Args:
          values: mapping of Google's bert_config.json keys to values.
          source: what the dict came from, used in error messages (e.g. a file path).

        Raises:
          ValueError: a key is unknown or a value is invalid; the message names the key.
        """
        if not isinstance(values, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(values).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known - _IGNORED_GOOGLE_KEYS)
        if unknown:
            raise ValueError(
                f"{source}: unknown BertConfig key(s) {unknown}. Known keys: {sorted(known)}"
            )
        kwargs = {k: v for k, v in values.items() if k in known}
        try:
            return cls(**kwargs)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """Returns the config as a plain dict with bert_config.json keys."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "BertConfig":
        """Reads a Google-style bert_config.json."""
        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                values = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"BERT config file not found: {path}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        return cls.from_dict(values, source=path)

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def to_json_file(self, path: str | os.PathLike, overwrite: bool = False) -> None:
        """Writes the config as bert_config.json (atomically; refuses to overwrite)."""
        from data_prep import files

        files.write_text(os.fspath(path), self.to_json_string(), overwrite=overwrite,
                         hint="pass overwrite=True to replace it")

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
            raise ValueError(f"Unknown BERT preset {name!r}. Available: {sorted(PRESETS)}")
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
