"""Tokenizers for the GRPO loop: text to token ids and back, with EOS from the server.

Two kinds, both chosen with ``whitney-grpo --tokenizer``:

- :class:`ByteTokenizer` (``byte``): UTF-8 bytes are ids 0..255, the scheme of the built-in
  ``whitney-mock/tiny-byte`` model; it needs a vocabulary of at least 256 ids.
- :class:`HFTokenizer` (a ``tokenizer.json``, or a folder holding one): a Hugging Face
  tokenizer loaded with the ``tokenizers`` library, from the local file only (no download).

Before use a tokenizer is bound to the server's base model (:meth:`bind`, given the
capabilities ``base_models[]`` entry):

- **EOS** is the model's ``eos_token_id`` from capabilities (the id the server stops on).
- **BOS**, put before every text prompt: the tokenizer's own: for a Hugging Face tokenizer, the
  ``bos_token`` of the ``tokenizer_config.json`` beside it (unless its ``add_bos_token`` is
  false), else the one token its post-processor puts before a text; when the tokenizer says
  nothing (the byte tokenizer; a ``tokenizer.json`` with no ``tokenizer_config.json`` and no
  such post-processor), the capabilities' optional ``bos_token_id``; else no BOS.
- **Decoding** (:meth:`decode`): the text of the tokens before the first EOS, special tokens
  left out. Real models pad their vocabulary beyond the tokenizer's (Qwen3: 151,936 ids in the
  model, fewer in the tokenizer), so a server may sample ids no tokenizer can decode: each is
  shown in place as ``<id:N>`` (:func:`undecodable`), the rest is decoded as usual.

The CLI and the loop hold no token id as a constant: the byte tokenizer's defaults (BOS 256,
EOS 257) only describe ``whitney-mock/tiny-byte`` for the library's byte tasks and tests, and
:meth:`bind` replaces them with the server's numbers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

__all__ = ["ByteTokenizer", "HFTokenizer", "Tokenizer", "load_tokenizer", "undecodable"]

#: Number of byte values: the byte tokenizer's ids are 0..255.
BYTE_VALUES = 256


def undecodable(token: int) -> str:
    """How :meth:`Tokenizer.decode` shows an id the tokenizer cannot decode: ``<id:N>``."""
    return f"<id:{token}>"


class Tokenizer(Protocol):
    """What the loop and the CLI need of a tokenizer (see the module docstring)."""

    @property
    def name(self) -> str:
        """``byte``, or the tokenizer file's path."""
        ...

    @property
    def bos_token_id(self) -> int | None:
        """The id put before every text prompt (``None``: none)."""
        ...

    @property
    def eos_token_id(self) -> int | None:
        """The server's EOS once bound; decoding stops there."""
        ...

    def encode(self, text: str) -> list[int]:
        """A prompt's ids: BOS (if any), then the text's tokens."""
        ...

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` before the first EOS; undecodable ids as ``<id:N>``."""
        ...

    def bind(self, model: Mapping[str, Any]) -> Tokenizer:
        """This tokenizer with EOS (and, if it has none of its own, BOS) of ``model``, a
        capabilities ``base_models[]`` entry; ``ValueError`` if it cannot serve that model."""
        ...


@dataclass(frozen=True)
class ByteTokenizer:
    """Bytes 0..255 are tokens 0..255; BOS and EOS are the model's (by default those of
    ``whitney-mock/tiny-byte``: 256 and 257). ``bos_token_id=None``: no BOS."""

    bos_token_id: int | None = 256
    eos_token_id: int | None = 257
    name: str = "byte"

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        """UTF-8 bytes of ``text``, after BOS unless ``add_bos`` is false (or there is none)."""
        bos = [self.bos_token_id] if add_bos and self.bos_token_id is not None else []
        return bos + list(text.encode("utf-8"))

    def decode(self, tokens: Sequence[int]) -> str:
        """Text of ``tokens`` up to the first EOS; BOS is dropped, any other id above 255 shows
        as ``<id:N>``, invalid UTF-8 becomes U+FFFD."""
        parts: list[str] = []
        data = bytearray()
        for token in tokens:
            if token == self.eos_token_id:
                break
            if token == self.bos_token_id:
                continue
            if 0 <= token < BYTE_VALUES:
                data.append(token)
            else:
                parts.append(data.decode("utf-8", errors="replace"))
                data.clear()
                parts.append(undecodable(token))
        parts.append(data.decode("utf-8", errors="replace"))
        return "".join(parts)

    def bind(self, model: Mapping[str, Any]) -> ByteTokenizer:
        """EOS and BOS from the model's capabilities entry (no BOS if it declares none)."""
        vocab = int(model["vocab_size"])
        if vocab < BYTE_VALUES:
            raise ValueError(f"the byte tokenizer needs a vocabulary of at least {BYTE_VALUES} "
                             f"ids, base model {model['id']!r} has {vocab}: pass --tokenizer "
                             f"PATH (a tokenizer.json) or token-id prompts (.jsonl)")
        bos = model.get("bos_token_id")
        return replace(self, eos_token_id=int(model["eos_token_id"]),
                       bos_token_id=None if bos is None else int(bos))


def _token_text(value: object) -> str | None:
    """``tokenizer_config.json`` names special tokens as a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` (``tokenizers`` library, local file only)."""

    def __init__(self, path: str | Path) -> None:
        given = Path(path).expanduser()
        file = given / "tokenizer.json" if given.is_dir() else given
        if not file.is_file():
            raise ValueError(f"--tokenizer {path}: " + (
                "no tokenizer.json in this folder" if given.is_dir() else "no such file"))
        try:
            from tokenizers import Tokenizer as _HF
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise ValueError(f"--tokenizer {path}: the 'tokenizers' package is needed "
                             f"({exc})") from None
        try:
            self._tokenizer = _HF.from_file(str(file))
        except Exception as exc:  # the Rust side raises its own exception type
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ValueError(f"--tokenizer {file}: not a tokenizer.json ({first})") from None
        self.file = file
        self.name = str(file)
        self.size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.eos_token_id: int | None = None
        self.bos_token_id, self.has_bos_opinion = self._own_bos()

    def _own_bos(self) -> tuple[int | None, bool]:
        """(BOS, whether the tokenizer decides about BOS at all); see the module docstring."""
        config_path = self.file.parent / "tokenizer_config.json"
        if config_path.is_file():
            try:
                config = json.loads(config_path.read_text("utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValueError(f"{config_path}: unreadable ({exc})") from None
            if isinstance(config, dict):
                text = _token_text(config.get("bos_token"))
                if text is not None and config.get("add_bos_token") is not False:
                    bos = self._tokenizer.token_to_id(text)
                    if bos is None:
                        raise ValueError(f"{config_path}: bos_token {text!r} is not in "
                                         f"{self.file.name}")
                    return bos, True
                return self._post_processor_bos(), True
        bos = self._post_processor_bos()
        return bos, bos is not None

    def _post_processor_bos(self) -> int | None:
        plain = self._tokenizer.encode("a", add_special_tokens=False).ids
        full = self._tokenizer.encode("a", add_special_tokens=True).ids
        if len(full) == len(plain) + 1 and full[1:] == plain:
            return int(full[0])
        return None

    def encode(self, text: str) -> list[int]:
        """BOS (if any), then the text's tokens (the post-processor's own specials are not
        added: BOS is put by this method, once)."""
        ids = [int(t) for t in self._tokenizer.encode(text, add_special_tokens=False).ids]
        return ([self.bos_token_id] if self.bos_token_id is not None else []) + ids

    def decodable(self, token: int) -> bool:
        """Whether the tokenizer knows ``token`` (ids beyond its vocabulary are not)."""
        return 0 <= token < self.size and self._tokenizer.id_to_token(token) is not None

    def decode(self, tokens: Sequence[int]) -> str:
        """The text before the first EOS, special tokens left out, ``<id:N>`` for ids the
        tokenizer cannot decode (the runs between them are decoded as usual)."""
        parts: list[str] = []
        run: list[int] = []
        for token in tokens:
            if token == self.eos_token_id:
                break
            if self.decodable(token):
                run.append(token)
                continue
            if run:
                parts.append(self._tokenizer.decode(run, skip_special_tokens=True))
                run = []
            parts.append(undecodable(token))
        if run:
            parts.append(self._tokenizer.decode(run, skip_special_tokens=True))
        return "".join(parts)

    def bind(self, model: Mapping[str, Any]) -> HFTokenizer:
        bound = object.__new__(HFTokenizer)
        bound.__dict__.update(self.__dict__)
        bound.eos_token_id = int(model["eos_token_id"])
        if not self.has_bos_opinion and model.get("bos_token_id") is not None:
            bound.bos_token_id = int(model["bos_token_id"])
        return bound


def load_tokenizer(spec: str) -> ByteTokenizer | HFTokenizer:
    """``byte``, or a path to a ``tokenizer.json`` or a folder holding one (unbound: call
    :meth:`~Tokenizer.bind` with the server's model). ``ValueError`` with one line."""
    if spec == "byte":
        return ByteTokenizer()
    return HFTokenizer(spec)
