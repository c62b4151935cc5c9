"""What a base model and a LoRA adapter are: the model specs, the vocabulary, and the
containers the rest of the mock passes around (``Lora``, ``LossResult``). Numpy only.

Base models are either the built-in byte model (``whitney-mock/tiny-byte``) or *declared*:
an id plus ``vocab_size``, ``eos_token_id``, optional ``bos_token_id``, ``max_context`` and
``max_lora_rank`` (:meth:`ModelSpec.declare`, or :func:`spec_from_hf_folder` for a local
Hugging Face model folder). A declared model uses the vocabulary-independent architecture
(hashed input embedding, bucketed output layer), so any vocabulary size costs the same.
"""

from __future__ import annotations

import json
import numbers
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

BASE_MODEL_ID = "whitney-mock/tiny-byte"
BOS_TOKEN = 256
EOS_TOKEN = 257
VOCAB_SIZE = 258

#: Architectures: the byte model's dense embedding and exact 258-way head, and the
#: vocabulary-independent one (hashed embedding rows, ``min(V, max_buckets)`` buckets).
BYTE_ARCHITECTURE = "tiny-byte"
BUCKET_ARCHITECTURE = "hashed-buckets"
ARCHITECTURES = (BYTE_ARCHITECTURE, BUCKET_ARCHITECTURE)
MIN_VOCAB = 2
MAX_VOCAB = 1 << 20  # the hashed embedding's index arithmetic is sized for 20-bit ids
MAX_BUCKETS = 256  # output buckets of a declared model (measured: K=256 costs as V=258)
DEFAULT_MAX_CONTEXT = 2048
DEFAULT_MAX_LORA_RANK = 64
MAX_LORA_RANK_LIMIT = 4096
MAX_CONTEXT_LIMIT = 1 << 24


class NonFiniteLossError(ValueError):
    """The loss or a gradient is not finite (e.g. input ``logprobs`` so far below the current
    ones that exp(p - q) overflows). Raised before anything is returned, so callers can refuse
    the call without touching training state (ERR-3; the mock answers 409
    ``non_finite_loss``)."""


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class ModelSpec:
    """Public facts about a base model (the capabilities ``base_models`` entry) plus its dims.

    Constructing one validates it: a ``ValueError`` with one line naming the model and the
    problem (vocabulary below 2, EOS outside the vocabulary ...). Integral numpy values are
    accepted and stored as ``int``. Hashable, so it keys the cache of base models.
    """

    id: str
    vocab_size: int
    max_context: int
    eos_token_id: int
    bos_token_id: int | None
    max_lora_rank: int
    embed_dim: int = 32
    hidden_dim: int = 64
    ema_decay: float = 0.8
    architecture: str = BUCKET_ARCHITECTURE
    max_buckets: int = MAX_BUCKETS

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id.strip() or self.id != self.id.strip() \
                or not self.id.isprintable():
            raise ValueError(f"base model id must be a non-empty printable string without "
                             f"surrounding spaces, got {self.id!r}")
        name = f"base model {self.id!r}"
        ranges: tuple[tuple[str, int, int], ...] = (
            ("vocab_size", MIN_VOCAB, MAX_VOCAB),
            ("max_context", 1, MAX_CONTEXT_LIMIT),
            ("max_lora_rank", 1, MAX_LORA_RANK_LIMIT),
            ("embed_dim", 1, 1024),
            ("hidden_dim", 1, 1024),
            ("max_buckets", 3, 1 << 16),
        )
        for field_name, low, high in ranges:
            value = getattr(self, field_name)
            if not _is_int(value) or not low <= value <= high:
                raise ValueError(f"{name}: {field_name} must be an integer in [{low}, {high}], "
                                 f"got {value!r}")
            object.__setattr__(self, field_name, int(value))
        vocab = self.vocab_size
        for field_name in ("eos_token_id", "bos_token_id"):
            value = getattr(self, field_name)
            if value is None and field_name == "bos_token_id":
                continue
            if not _is_int(value) or not 0 <= value < vocab:
                raise ValueError(f"{name}: {field_name} {value!r} outside the vocabulary "
                                 f"[0, {vocab})")
            object.__setattr__(self, field_name, int(value))
        if not isinstance(self.ema_decay, (int, float)) or isinstance(self.ema_decay, bool) \
                or not 0.0 < self.ema_decay < 1.0:
            raise ValueError(f"{name}: ema_decay must be a number in (0, 1), "
                             f"got {self.ema_decay!r}")
        object.__setattr__(self, "ema_decay", float(self.ema_decay))
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"{name}: architecture must be one of {ARCHITECTURES}, "
                             f"got {self.architecture!r}")
        if self.architecture == BYTE_ARCHITECTURE and (
                vocab, self.eos_token_id, self.bos_token_id) != (VOCAB_SIZE, EOS_TOKEN, BOS_TOKEN):
            raise ValueError(f"{name}: the {BYTE_ARCHITECTURE} architecture needs vocab_size "
                             f"{VOCAB_SIZE}, eos_token_id {EOS_TOKEN} and bos_token_id "
                             f"{BOS_TOKEN}")

    @classmethod
    def declare(cls, id: str, vocab_size: int, eos_token_id: int,
                bos_token_id: int | None = None, *, max_context: int = DEFAULT_MAX_CONTEXT,
                max_lora_rank: int = DEFAULT_MAX_LORA_RANK) -> ModelSpec:
        """A declared base model (vocabulary-independent architecture); ``ValueError`` with
        one line for a bad declaration. ``bos_token_id`` may equal ``eos_token_id``."""
        return cls(id=id, vocab_size=vocab_size, max_context=max_context,
                   eos_token_id=eos_token_id, bos_token_id=bos_token_id,
                   max_lora_rank=max_lora_rank)

    @property
    def special_token_ids(self) -> tuple[int, ...]:
        """EOS and BOS (when declared), ascending, without repeats: the ids that get a
        bucket of their own."""
        return tuple(sorted({self.eos_token_id} | ({self.bos_token_id}
                                                    if self.bos_token_id is not None else set())))

    @property
    def num_buckets(self) -> int:
        """K, the width of the output layer: V for the byte model and for declared models
        with V <= ``max_buckets``, else ``max_buckets``."""
        if self.architecture == BYTE_ARCHITECTURE:
            return self.vocab_size
        return min(self.vocab_size, self.max_buckets)

    def capabilities_entry(self) -> dict[str, object]:
        """The DISC-1 ``base_models[]`` object."""
        entry: dict[str, object] = {
            "id": self.id,
            "vocab_size": self.vocab_size,
            "max_context": self.max_context,
            "eos_token_id": self.eos_token_id,
            "max_lora_rank": self.max_lora_rank,
        }
        if self.bos_token_id is not None:  # an added, optional field (EXT-1)
            entry["bos_token_id"] = self.bos_token_id
        return entry


#: The built-in base models by id: what a mock serves when no model is declared, and the
#: only ids that may be declared by id alone (with their own numbers, or none).
BASE_MODEL_SPECS: dict[str, ModelSpec] = {
    BASE_MODEL_ID: ModelSpec(
        id=BASE_MODEL_ID,
        vocab_size=VOCAB_SIZE,
        max_context=2048,
        eos_token_id=EOS_TOKEN,
        bos_token_id=BOS_TOKEN,
        max_lora_rank=64,
        architecture=BYTE_ARCHITECTURE,
    )
}




def lora_key(module: str, which: str) -> str:
    """PEFT state-dict key, e.g. ``base_model.model.lm_head.lora_A.weight``."""
    return f"base_model.model.{module}.lora_{which}.weight"


@dataclass
class Lora:
    """A LoRA adapter: ``params`` keyed by PEFT names (see :func:`lora_key`), rank, alpha."""

    params: dict[str, np.ndarray]
    rank: int
    alpha: float

    @property
    def scale(self) -> float:
        """PEFT's scaling ``alpha / r``."""
        return self.alpha / self.rank

    def copy(self) -> Lora:
        """Deep copy (arrays copied): versions and checkpoints never alias live weights."""
        return Lora(params={k: a.copy() for k, a in self.params.items()}, rank=self.rank,
                    alpha=self.alpha)


@dataclass
class LossResult:
    """``loss`` summed over all positions; ``logprobs`` p per datum; ``grads`` keyed like
    ``lora.params`` (None when not requested)."""

    loss: float
    logprobs: list[np.ndarray]
    grads: dict[str, np.ndarray] | None


# --------------------------------------------------------------------- Hugging Face folders

class HFFolderError(ValueError):
    """A local Hugging Face model folder that cannot be read as a base model declaration;
    the message is one line naming the folder or file and the problem."""


def _read_json(folder: Path, name: str, *, required: bool) -> dict[str, Any] | None:
    path = folder / name
    if not path.exists():
        if required:
            raise HFFolderError(f"{path}: missing (a Hugging Face model folder has a {name})")
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HFFolderError(f"{path}: unreadable ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else exc!r})") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HFFolderError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} "
                            f"column {exc.colno})") from None
    if not isinstance(document, dict):
        raise HFFolderError(f"{path}: expected a JSON object, got {type(document).__name__}")
    return document


def _sections(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The config itself, then its nested ``text_config`` (multimodal models keep the
    language model's numbers there)."""
    nested = config.get("text_config")
    return [config] + ([nested] if isinstance(nested, dict) else [])


def _as_int(value: object) -> int | None:
    """An integer JSON value (``3`` or ``3.0``) as int; anything else (bools too) None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _first_int(value: object) -> int | None:
    """An id field: an integer, or a list of them (``eos_token_id`` often is): its first."""
    if isinstance(value, list) and value:
        value = value[0]
    return _as_int(value)


def _token_string(value: object) -> str | None:
    """``tokenizer_config.json``'s ``eos_token`` is a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _token_id_of(content: str, tokenizer_config: dict[str, Any] | None,
                 folder: Path) -> int | None:
    """The id of a special token's text: ``added_tokens_decoder`` of tokenizer_config.json,
    else ``added_tokens`` of tokenizer.json (when present)."""
    decoder = (tokenizer_config or {}).get("added_tokens_decoder")
    if isinstance(decoder, dict):
        for key, entry in decoder.items():
            if isinstance(entry, dict) and entry.get("content") == content and key.isdigit():
                return int(key)
    tokenizer = _read_json(folder, "tokenizer.json", required=False)
    if tokenizer is not None:
        for entry in tokenizer.get("added_tokens") or []:
            if isinstance(entry, dict) and entry.get("content") == content \
                    and _as_int(entry.get("id")) is not None:
                return _as_int(entry.get("id"))
        vocab = (tokenizer.get("model") or {}).get("vocab")
        if isinstance(vocab, dict) and _as_int(vocab.get(content)) is not None:
            return _as_int(vocab.get(content))
    return None


def _special_id(which: str, generation: dict[str, Any] | None, config: dict[str, Any],
                tokenizer_config: dict[str, Any] | None, folder: Path) -> tuple[int | None, str]:
    """(id, where it came from) for ``which`` in ("eos", "bos")."""
    key = f"{which}_token_id"
    if generation is not None and _first_int(generation.get(key)) is not None:
        return _first_int(generation.get(key)), f"generation_config.json {key}"
    for section in _sections(config):
        if _first_int(section.get(key)) is not None:
            return _first_int(section.get(key)), f"config.json {key}"
    text = _token_string((tokenizer_config or {}).get(f"{which}_token"))
    if text is not None:
        found = _token_id_of(text, tokenizer_config, folder)
        if found is not None:
            return found, f"tokenizer_config.json {which}_token {text!r}"
        return None, f"tokenizer_config.json {which}_token {text!r} (id not found)"
    return None, ""


def spec_from_hf_folder(path: str | Path, *, model_id: str | None = None,
                        max_context: int | None = None,
                        max_lora_rank: int = DEFAULT_MAX_LORA_RANK) -> ModelSpec:
    """A declared :class:`ModelSpec` from a local Hugging Face model folder, offline (json only).

    - ``vocab_size`` and ``max_context`` (``max_position_embeddings``, else ``n_positions``,
      ``max_sequence_length``, ``seq_length``, else tokenizer_config's ``model_max_length``
      when it is a real number, else 2048) from ``config.json`` (or its ``text_config``);
    - ``eos_token_id`` (a list: its first) and ``bos_token_id`` from
      ``generation_config.json``, else ``config.json``, else the ``eos_token`` / ``bos_token``
      text of ``tokenizer_config.json`` looked up in its ``added_tokens_decoder`` (or
      ``tokenizer.json``). No EOS anywhere is an error; no BOS means none.
    - the id: ``model_id``, else the folder's name.

    Raises :class:`HFFolderError` (a ``ValueError``) with one line for a missing or unreadable
    folder or file, invalid JSON, missing numbers, or numbers the spec refuses.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise HFFolderError(f"{folder}: not a folder" if folder.exists()
                            else f"{folder}: no such folder")
    config = _read_json(folder, "config.json", required=True)
    assert config is not None
    generation = _read_json(folder, "generation_config.json", required=False)
    tokenizer_config = _read_json(folder, "tokenizer_config.json", required=False)
    vocab = next((_as_int(s.get("vocab_size")) for s in _sections(config)
                  if _as_int(s.get("vocab_size")) is not None), None)
    if vocab is None:
        raise HFFolderError(f"{folder / 'config.json'}: no integer vocab_size")
    if max_context is None:
        for section in _sections(config):
            for key in ("max_position_embeddings", "n_positions", "max_sequence_length",
                        "seq_length"):
                if max_context is None:
                    max_context = _as_int(section.get(key))
    if max_context is None:
        length = _as_int((tokenizer_config or {}).get("model_max_length"))
        if length is not None and 0 < length <= MAX_CONTEXT_LIMIT:
            max_context = length
    eos, eos_from = _special_id("eos", generation, config, tokenizer_config, folder)
    if eos is None:
        raise HFFolderError(f"{folder}: no eos_token_id in generation_config.json or "
                            f"config.json" + (f", and {eos_from}" if eos_from else
                                              ", and no eos_token in tokenizer_config.json"))
    bos, _ = _special_id("bos", generation, config, tokenizer_config, folder)
    name = model_id if model_id is not None else folder.resolve().name
    try:
        return ModelSpec.declare(name, vocab, eos, bos,
                                 max_context=DEFAULT_MAX_CONTEXT if max_context is None
                                 else max_context, max_lora_rank=max_lora_rank)
    except ValueError as exc:
        raise HFFolderError(f"{folder}: {exc}") from None


# --------------------------------------------------------------------- declarations

#: The fields of a declaration (the capabilities ``base_models[]`` names) and the short
#: aliases the one-line syntax accepts for them.
DECLARATION_FIELDS = ("vocab_size", "eos_token_id", "bos_token_id", "max_context",
                      "max_lora_rank")
_ALIASES = {"vocab": "vocab_size", "eos": "eos_token_id", "bos": "bos_token_id"}
DECLARATION_SYNTAX = ("ID:vocab_size=N,eos=N[,bos=N][,max_context=N][,max_lora_rank=N]")


def _declared_from_fields(model_id: str, fields: dict[str, Any], where: str) -> ModelSpec:
    """A spec from an id and declaration fields (canonical names); the built-in ids resolve
    to the built-in spec when every given number is its own."""
    builtin = BASE_MODEL_SPECS.get(model_id)
    if builtin is not None:
        entry = {**builtin.capabilities_entry(), "bos_token_id": builtin.bos_token_id}
        differing = sorted(k for k, v in fields.items() if entry.get(k) != v)
        if differing:
            own = ", ".join(f"{k}={entry[k]}" for k in DECLARATION_FIELDS)
            raise ValueError(f"{where}: {model_id!r} is the built-in model ({own}); "
                             f"{', '.join(differing)} differ: declare another id for other "
                             f"numbers")
        return builtin
    missing = [k for k in ("vocab_size", "eos_token_id") if k not in fields]
    if missing:
        raise ValueError(f"{where}: base model {model_id!r} needs {' and '.join(missing)} "
                         f"(syntax {DECLARATION_SYNTAX})")
    try:
        return ModelSpec.declare(model_id, fields["vocab_size"], fields["eos_token_id"],
                                 fields.get("bos_token_id"),
                                 max_context=fields.get("max_context", DEFAULT_MAX_CONTEXT),
                                 max_lora_rank=fields.get("max_lora_rank",
                                                          DEFAULT_MAX_LORA_RANK))
    except ValueError as exc:  # its message names the model and the problem
        raise ValueError(str(exc)) from None


def parse_base_model(text: str) -> ModelSpec:
    """A base model declared in one line: ``ID:vocab_size=N,eos=N[,bos=N][,max_context=N]
    [,max_lora_rank=N]`` (``vocab``, ``eos``, ``bos`` abbreviate ``vocab_size``,
    ``eos_token_id``, ``bos_token_id``; spaces around items are ignored), or a built-in id
    alone (``whitney-mock/tiny-byte``). The id ends at the last ``:`` before the first ``=``.

    ``ValueError`` with one line naming the declaration and the problem.
    """
    where = f"base model declaration {text!r}"
    text = text.strip()
    head, sep, _ = text.partition("=")
    if not sep:
        if text in BASE_MODEL_SPECS:
            return BASE_MODEL_SPECS[text]
        raise ValueError(f"{where}: give the model's numbers, e.g. "
                         f"'{text or 'org/model'}:vocab_size=151936,eos=151645' "
                         f"(syntax {DECLARATION_SYNTAX}), or declare it from a folder")
    model_id, colon, _ = head.rpartition(":")
    if not colon or not model_id.strip():
        raise ValueError(f"{where}: expected {DECLARATION_SYNTAX}")
    fields: dict[str, Any] = {}
    for item in text[len(model_id) + 1:].split(","):
        key, eq, value = (part.strip() for part in item.partition("="))
        name = _ALIASES.get(key, key)
        if not eq or name not in DECLARATION_FIELDS:
            raise ValueError(f"{where}: {item.strip()!r} is not NAME=INTEGER with NAME one of "
                             f"{', '.join(DECLARATION_FIELDS)} (or vocab, eos, bos)")
        if name in fields:
            raise ValueError(f"{where}: {name} given twice")
        if not value.isascii() or not value.isdigit():
            raise ValueError(f"{where}: {key}={value!r} is not a non-negative integer")
        fields[name] = int(value)
    return _declared_from_fields(model_id.strip(), fields, where)


def base_model_from_folder(value: str | os.PathLike[str]) -> ModelSpec:
    """A base model from a local Hugging Face folder (:func:`spec_from_hf_folder`), its id the
    folder's name; ``ID=DIR`` names it (a value that is itself an existing folder is always
    the folder). ``ValueError`` (:class:`HFFolderError`) with one line."""
    text = os.fspath(value)
    model_id: str | None = None
    if not Path(text).expanduser().is_dir() and "=" in text:
        model_id, _, text = text.partition("=")
        model_id = model_id.strip()
    return spec_from_hf_folder(text, model_id=model_id)


def declare_base_models(items: Iterable[ModelSpec | str | Mapping[str, Any]
                                        | os.PathLike[str]] | None) -> tuple[ModelSpec, ...]:
    """The base models a mock serves, in the order given; the built-in byte model when none.

    Each item is a :class:`ModelSpec`; a ``str`` in the one-line syntax of
    :func:`parse_base_model`; a mapping with the capabilities entry's names (``id``,
    ``vocab_size``, ``eos_token_id``, optional ``bos_token_id``, ``max_context``,
    ``max_lora_rank``); or a path (``pathlib.Path``) to a Hugging Face model folder. An id may
    be declared once. Every problem is a ``ValueError`` with one line.
    """
    specs: list[ModelSpec] = []
    for item in items or ():
        if isinstance(item, ModelSpec):
            spec = item
            builtin = BASE_MODEL_SPECS.get(spec.id)
            if builtin is not None and spec != builtin:
                spec = _declared_from_fields(spec.id, {
                    "vocab_size": spec.vocab_size, "eos_token_id": spec.eos_token_id,
                    "bos_token_id": spec.bos_token_id, "max_context": spec.max_context,
                    "max_lora_rank": spec.max_lora_rank}, f"base model {spec.id!r}")
        elif isinstance(item, str):
            spec = parse_base_model(item)
        elif isinstance(item, os.PathLike):
            spec = base_model_from_folder(item)
        elif isinstance(item, Mapping):
            where = f"base model declaration {dict(item)!r}"
            model_id = item.get("id")
            if not isinstance(model_id, str):
                raise ValueError(f"{where}: needs a string 'id'")
            unknown = sorted(set(item) - {"id", *DECLARATION_FIELDS})
            if unknown:
                raise ValueError(f"{where}: unknown key(s) {unknown}; known: id, "
                                 f"{', '.join(DECLARATION_FIELDS)}")
            fields = {k: v for k, v in item.items() if k != "id"}
            if fields.get("bos_token_id", 0) is None:
                del fields["bos_token_id"]
            spec = _declared_from_fields(model_id, fields, where)
        else:
            raise ValueError(f"a base model is a ModelSpec, a declaration string, a mapping or "
                             f"a folder path, got {type(item).__name__}")
        if any(known.id == spec.id for known in specs):
            raise ValueError(f"base model {spec.id!r} declared twice")
        specs.append(spec)
    return tuple(specs) if specs else tuple(BASE_MODEL_SPECS.values())
