"""Tokenizer settings that travel with the vocabulary, from build_vocab to the served model.

A vocabulary alone does not say how to tokenize: the same vocab.txt gives other ids with
`do_lower_case`, `strip_accents` or `tokenize_chinese_chars` changed (a Korean vocabulary
learned with strip_accents=false turns into [UNK]s under the uncased default, which
decomposes Hangul). So wherever a tool writes a vocab.txt it writes `tokenizer_config.json`
beside it, and every tool given a vocabulary or a model directory reads it back:

    build_vocab            writes vocab.txt + tokenizer_config.json
    create_pretraining_data reads them; records the settings in every shard's sidecar
    run_pretraining        settings from the data's sidecars (or beside --vocab_file);
                           writes them into output_dir/encoder/
    run_classifier, ...    read them from the model directory; save them with the model
    export_*               read them; ship them as an asset of the SavedModel

The file uses the keys of Hugging Face's `tokenizer_config.json` (do_lower_case,
strip_accents, tokenize_chinese_chars, the special tokens, tokenizer_class), so
transformers' `BertTokenizer.from_pretrained(dir)` reads our directories, and a Hugging Face
model directory's own file is read the same way. Google's checkpoints carry no such file:
their casing comes from the flags, as in Google's tools. Our own extra keys sit under
"bert_keras" (transformers keeps and ignores them).

Explicit flags (`--do_lower_case`, `--strip_accents`, `--tokenize_chinese_chars`) override a
saved setting; an override that changes the effective setting is reported in one line,
since ids then differ from the ones the model was trained on.
"""

from __future__ import annotations

import dataclasses
import os
import unicodedata
from typing import Any, Callable, Mapping

from data_prep import files, schema
from data_prep.cli import ToolError

FORMAT = "bert-keras-tokenizer/1"
SETTINGS = ("do_lower_case", "strip_accents", "tokenize_chinese_chars")
_SPECIAL_KEYS = {"pad_token": schema.PAD, "unk_token": schema.UNK, "cls_token": schema.CLS,
                 "sep_token": schema.SEP, "mask_token": schema.MASK}


class TokenizerConfigError(ToolError):
    """A tokenizer_config.json is malformed or asks for what the tokenizer cannot do."""


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    """How text becomes WordPieces with a given vocabulary (Hugging Face's BertTokenizer keys).

    Attributes:
      do_lower_case: lowercase the text (uncased models).
      strip_accents: NFD + drop nonspacing marks; None follows do_lower_case (Google's and
        Hugging Face's default). Korean: do_lower_case=True, strip_accents=False.
      tokenize_chinese_chars: make every CJK ideograph a word of its own.
    """

    do_lower_case: bool = True
    strip_accents: bool | None = None
    tokenize_chinese_chars: bool = True

    def __post_init__(self):
        for name in ("do_lower_case", "tokenize_chinese_chars"):
            if not isinstance(getattr(self, name), bool):
                raise TokenizerConfigError(f"{name} must be true or false; received "
                                           f"{getattr(self, name)!r}")
        if self.strip_accents is not None and not isinstance(self.strip_accents, bool):
            raise TokenizerConfigError(f"strip_accents must be true, false or null; received "
                                       f"{self.strip_accents!r}")

    @property
    def effective_strip_accents(self) -> bool:
        """strip_accents with None resolved (it follows do_lower_case)."""
        return self.do_lower_case if self.strip_accents is None else self.strip_accents

    def effective(self) -> tuple[bool, bool, bool]:
        """(do_lower_case, strip_accents, tokenize_chinese_chars) as the tokenizer applies them."""
        return self.do_lower_case, self.effective_strip_accents, self.tokenize_chinese_chars

    def same_tokenization(self, other: "TokenizerConfig") -> bool:
        return self.effective() == other.effective()

    def describe(self) -> str:
        lower, strip, cjk = self.effective()
        return f"do_lower_case={lower}, strip_accents={strip}, tokenize_chinese_chars={cjk}"

    def to_json_dict(self, vocab_file: str | None = None,
                     model_max_length: int | None = None) -> dict:
        """The tokenizer_config.json content (Hugging Face keys + ours under "bert_keras");
        `model_max_length`, where given, is transformers' key for what its tokenizer
        truncates to (the model's position table)."""
        values: dict[str, Any] = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": self.do_lower_case,
            "strip_accents": self.strip_accents,
            "tokenize_chinese_chars": self.tokenize_chinese_chars,
            **_SPECIAL_KEYS,
        }
        if model_max_length is not None:
            values["model_max_length"] = int(model_max_length)
        ours: dict[str, Any] = {"format": FORMAT}
        if vocab_file is not None:
            ours["vocab_file"] = os.path.basename(vocab_file)
        values["bert_keras"] = ours
        return values

    @classmethod
    def from_json_dict(cls, values: Mapping[str, Any], source: str = "tokenizer_config.json"
                       ) -> "TokenizerConfig":
        """Reads the settings; absent keys take Hugging Face's defaults.

        Raises:
          TokenizerConfigError: a setting of the wrong type, or special tokens other than
            BERT's (the in-graph tokenizer and the TFRecord tools look those up by name).
        """
        if not isinstance(values, Mapping):
            raise TokenizerConfigError(f"{source}: expected a JSON object, found "
                                       f"{type(values).__name__}")
        for key, expected in _SPECIAL_KEYS.items():
            token = values.get(key, expected)
            if isinstance(token, Mapping):  # transformers' AddedToken form
                token = token.get("content", expected)
            if token not in (None, expected):
                raise TokenizerConfigError(
                    f"{source}: {key} is {token!r}; bert-keras tokenizes with BERT's special "
                    f"tokens {list(schema.SPECIAL_TOKENS)}")
        try:
            return cls(do_lower_case=values.get("do_lower_case", True),
                       strip_accents=values.get("strip_accents", None),
                       tokenize_chinese_chars=values.get("tokenize_chinese_chars", True))
        except TokenizerConfigError as e:
            raise TokenizerConfigError(f"{source}: {e}") from None

    def with_overrides(self, overrides: Mapping[str, Any], source: str | None,
                       warn: Callable[[str], None] | None = None) -> "TokenizerConfig":
        """This config with explicitly given settings replaced.

        Args:
          overrides: a subset of SETTINGS -> value (strip_accents None means "follow
            do_lower_case"), as `overrides_from_flags` returns.
          source: where this config was read from (named in the report), or None when it is
            only a default (nothing is reported then).
          warn: receives the one-line report when an override changes the effective
            setting of a saved config.
        """
        unknown = set(overrides) - set(SETTINGS)
        if unknown:
            raise TokenizerConfigError(f"unknown tokenizer settings {sorted(unknown)}; "
                                       f"expected some of {list(SETTINGS)}")
        result = dataclasses.replace(self, **overrides)
        if source is not None and warn is not None and not result.same_tokenization(self):
            changed = [f"--{name}={_flag_text(overrides[name])}" for name in SETTINGS
                       if name in overrides and getattr(result, name) != getattr(self, name)]
            warn(f"{' '.join(changed)} overrides the tokenizer settings saved in {source} "
                 f"({self.describe()}): ids will differ from those the model was trained on")
        return result


def _flag_text(value) -> str:
    return "auto" if value is None else str(value).lower()


def path_for_vocab(vocab_file: str) -> str:
    """Where the settings of `vocab_file` live: tokenizer_config.json in its directory."""
    return os.path.join(os.path.dirname(files.absolute(vocab_file)), files.TOKENIZER_CONFIG_FILE)


def _read_json(path: str):
    try:
        return files.read_json(path)
    except OSError as e:
        raise TokenizerConfigError(f"{path}: cannot be read ({e})") from None
    except files.TextFileError as e:  # not UTF-8 text, or not JSON: the line named
        raise TokenizerConfigError(str(e)) from None


def read_file(path: str, tokenizer_json: Mapping | None = None
              ) -> tuple[TokenizerConfig, dict]:
    """Reads a tokenizer_config.json; returns (config, the raw JSON object).

    Where it gives no casing (transformers 5 writes none for a tokenizer built with the
    `tokenizers` library: the casing is tokenizer.json's normalizer), the normalizer of a
    tokenizer.json beside it gives it, as transformers' fast tokenizer reads it. Before,
    such a cased tokenizer read as uncased. `tokenizer_json`: that file's JSON object where
    the caller has read it (it is read here otherwise).
    """
    values = _read_json(path)
    if isinstance(values, Mapping) and not {"do_lower_case", "strip_accents"} & set(values):
        beside = os.path.join(os.path.dirname(files.absolute(path)), HF_TOKENIZER_FILE)
        if tokenizer_json is not None or files.isfile(beside):
            values = {**values, **normalizer_settings(beside, tokenizer_json)}
    return TokenizerConfig.from_json_dict(values, path), values


HF_TOKENIZER_FILE = "tokenizer.json"  # transformers' fast tokenizer (5.x saves only this)


def normalizer_settings(path: str, values: Mapping | None = None) -> dict:
    """The settings a transformers tokenizer.json's normalizer applies: BertNormalizer's
    `lowercase` / `strip_accents` / `handle_chinese_chars`, or a Sequence holding
    `Lowercase` and `StripAccents` (whose absence means that step is not done); {} for no
    normalizer or one of another kind (the defaults then apply). `values`: the file's JSON
    object where the caller has read it (`path` is read otherwise)."""
    if values is None:
        values = _read_json(path)
    normalizer = values.get("normalizer") if isinstance(values, Mapping) else None
    if not isinstance(normalizer, Mapping):
        return {}
    if normalizer.get("type") == "BertNormalizer":
        found = {"do_lower_case": normalizer.get("lowercase", True),
                 "strip_accents": normalizer.get("strip_accents"),
                 "tokenize_chinese_chars": normalizer.get("handle_chinese_chars", True)}
        return {k: v for k, v in found.items() if v is None or isinstance(v, bool)}
    steps = normalizer.get("normalizers") if normalizer.get("type") == "Sequence" else [
        normalizer]
    if not isinstance(steps, list):
        return {}
    kinds = {step.get("type") for step in steps if isinstance(step, Mapping)}
    if not kinds & {"Lowercase", "StripAccents"}:
        return {}
    return {"do_lower_case": "Lowercase" in kinds, "strip_accents": "StripAccents" in kinds}


def read_for_vocab(vocab_file: str, tokenizer_json: Mapping | None = None
                   ) -> tuple[TokenizerConfig, str] | None:
    """The settings saved beside `vocab_file`, or None if there are none for it.

    A tokenizer_config.json that names another vocabulary file of the same directory (in
    its "bert_keras" section) does not describe this one and is ignored, where that file is
    there; one naming a file that is gone (the vocabulary renamed, ko.txt to vocab.txt for
    transformers) describes this one. Before, a renamed vocabulary lost its settings: a
    Korean one was read with the uncased defaults (jamo, every Hangul word [UNK]).

    `tokenizer_json`: the JSON object of the tokenizer.json beside it where the caller has
    read it (`read_file`).

    Returns:
      (config, its path) or None.
    """
    found = _file_for_vocab(vocab_file, tokenizer_json)
    return None if found is None else found[:2]


def _file_for_vocab(vocab_file: str, tokenizer_json: Mapping | None = None
                    ) -> tuple[TokenizerConfig, str, dict] | None:
    """`read_for_vocab`'s (config, path), and the file's raw JSON object."""
    path = path_for_vocab(vocab_file)
    if not files.isfile(path):
        return None
    config, values = read_file(path, tokenizer_json)
    named = (values.get("bert_keras") or {}).get("vocab_file") if isinstance(
        values.get("bert_keras"), Mapping) else None
    if named and named != os.path.basename(vocab_file) and files.isfile(
            os.path.join(os.path.dirname(path), named)):
        return None
    return config, path, values


def saved_model_max_length(vocab_file: str) -> int | None:
    """transformers' `model_max_length` in the tokenizer_config.json of `vocab_file` (the
    longest input its tokenizer lets through with truncation), or None where there is none
    or it says "no limit" (transformers writes int(1e30) there)."""
    found = _file_for_vocab(vocab_file)
    if found is None:
        return None
    value = found[2].get("model_max_length")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 10**9:
        return None
    return value


def write_for_vocab(vocab_file: str, config: TokenizerConfig, overwrite: bool = True,
                    model_max_length: int | None = None) -> str:
    """Writes `config` as tokenizer_config.json beside `vocab_file`; returns its path."""
    path = path_for_vocab(vocab_file)
    return files.write_json(path, config.to_json_dict(vocab_file, model_max_length),
                            overwrite=overwrite)


def resolve(vocab_file: str | None, overrides: Mapping[str, Any] | None = None,
            saved: tuple[TokenizerConfig, str] | None = None,
            warn: Callable[[str], None] | None = None) -> tuple[TokenizerConfig, str | None]:
    """The settings to tokenize with: saved ones (given, or beside `vocab_file`), then flags.

    Args:
      vocab_file: the vocabulary, whose tokenizer_config.json is read when `saved` is None.
      overrides: explicitly given settings (see `overrides_from_flags`).
      saved: (config, source) from elsewhere (a sidecar, a model directory), if known.
      warn: receives the one-line report of a contradicting override.

    Returns:
      (config, source of the saved settings or None when only defaults and flags applied).
    """
    if saved is None and vocab_file:
        saved = read_for_vocab(vocab_file)
    base, source = saved if saved is not None else (TokenizerConfig(), None)
    config = base.with_overrides(dict(overrides or {}), source, warn)
    if source is None and vocab_file and warn is not None:
        _warn_if_made_otherwise(vocab_file, config, warn)
    return config, source


def unreachable_pieces(vocab: list[str], config: TokenizerConfig) -> list[str]:
    """The pieces of `vocab` that tokenizing under `config` never produces: capital letters
    where it lowercases, letters that decompose (accented Latin, Hangul syllables) where it
    strips accents. [X] tokens are left out."""
    lower, strip, _ = config.effective()
    found = []
    for token in vocab:
        if token.startswith("[") and token.endswith("]"):
            continue
        text = token[2:] if token.startswith("##") else token
        normal = text.lower() if lower else text
        if strip:
            normal = "".join(c for c in unicodedata.normalize("NFD", normal)
                             if unicodedata.category(c) != "Mn")
        if normal != text:
            found.append(token)
    return found


# Google's uncased vocabularies have no unreachable piece; a cased or Korean one read
# with the uncased defaults has thousands.
UNREACHABLE_SHARE = 0.005


def _warn_if_made_otherwise(vocab_file: str, config: TokenizerConfig,
                            warn: Callable[[str], None]) -> None:
    """Warns where settings taken from defaults and flags (no tokenizer_config.json beside
    the vocabulary) can never produce a share of its pieces."""
    try:
        vocab = schema.load_vocab(vocab_file)
    except schema.VocabError:
        return  # the tool's own loading names the problem
    unreachable = unreachable_pieces(vocab, config)
    if len(unreachable) < max(10, UNREACHABLE_SHARE * len(vocab)):
        return
    capitals = [t for t in unreachable if t != t.lower()]
    decomposing = [t for t in unreachable if t == t.lower()]  # lowercasing kept, stripping not
    hints = (["--do_lower_case=false (a cased vocabulary)"] if capitals else []) + (
        ["--strip_accents=false (letters that decompose: accents, Hangul)"] if decomposing else [])
    examples = capitals[:2] + decomposing[:2] if capitals and decomposing else unreachable[:4]
    warn(f"{vocab_file}: no {files.TOKENIZER_CONFIG_FILE} beside it, and {len(unreachable)} "
         f"of its {len(vocab)} pieces (such as {', '.join(examples)}) never come out "
         f"of the tokenizer with {config.describe()}: the vocabulary was made with other "
         f"settings? Pass {' or '.join(hints)}, or save its settings beside it")


# --- Command-line flags: the same three on every tool. ---


def define_flags(creating: bool = False) -> dict:
    """Defines --do_lower_case, --strip_accents and --tokenize_chinese_chars; returns holders.

    Args:
      creating: the tool creates the settings (build_vocab): the flags are the settings.
        Otherwise their defaults apply only when no settings were saved with the vocabulary
        or model, and an explicitly given flag overrides saved ones (`overrides_from_flags`).
    """
    from absl import flags

    from data_prep.cli import calling_module

    # The same names and types on every tool (several tools share a process in tests); the
    # flags belong to the calling tool, whose --help lists them.
    kwargs = {"allow_override": True, "module_name": calling_module()}
    saved = "; default " if creating else (
        "; default: the setting saved with the vocabulary or model, else ")
    return {
        "do_lower_case": flags.DEFINE_boolean(
            "do_lower_case", True, "Lowercase the text (uncased models)" + saved + "true.",
            **kwargs),
        "strip_accents": flags.DEFINE_enum(
            "strip_accents", "auto", ["auto", "true", "false"],
            "Strip accents (NFD + drop Mn); auto follows --do_lower_case; Korean: false"
            + saved + "auto.", **kwargs),
        "tokenize_chinese_chars": flags.DEFINE_boolean(
            "tokenize_chinese_chars", True, "Make every CJK ideograph a word of its own"
            + saved + "true.", **kwargs),
    }


def parse_strip_accents(value) -> bool | None:
    """"auto"/"true"/"false" (or None/True/False) -> None/True/False."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("auto", "none", "null", ""):
        return None
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise TokenizerConfigError(f"--strip_accents must be auto, true or false; received {value!r}")


def overrides_from_flags(holders: Mapping) -> dict:
    """The tokenizer flags given explicitly on the command line (name -> value)."""
    out = {}
    for name, holder in holders.items():
        if holder.present:
            value = holder.value
            out[name] = parse_strip_accents(value) if name == "strip_accents" else bool(value)
    return out


def from_values(do_lower_case: bool = True, strip_accents=None,
                tokenize_chinese_chars: bool = True) -> TokenizerConfig:
    """A config from plain values (strip_accents also as "auto"/"true"/"false")."""
    return TokenizerConfig(bool(do_lower_case), parse_strip_accents(strip_accents),
                           bool(tokenize_chinese_chars))
