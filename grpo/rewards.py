"""The caller's reward function: where it is loaded from and what it receives.

``--reward MODULE:FUNCTION`` imports ``MODULE`` as Python does, with the current folder first
on ``sys.path`` (so ``my_reward:reward`` finds ``./my_reward.py``); ``--reward
path/to/file.py:FUNCTION`` loads that file (its folder is put on ``sys.path`` too, for its own
imports).

What the reward receives (:data:`SIGNATURES`), decided once from its signature:

- ``reward(tokens)``: the seed's signature, the completion's token ids as sampled (a list of
  ints; the stop token, EOS, included when the completion stopped on it);
- ``reward(tokens, prompt_tokens)``: also the prompt's token ids (BOS included when used);
- any function whose parameters are named among ``tokens``, ``prompt_tokens``, ``text`` and
  ``prompt_text`` (or that takes ``**kwargs``), e.g. ``reward(text)`` or
  ``reward(text, tokens)``: those, by keyword. ``text`` is the completion decoded by the
  tokenizer (the text before the first EOS, special tokens left out, ids the tokenizer cannot
  decode shown as ``<id:N>``), ``prompt_text`` the prompt decoded the same way; both need a
  tokenizer (``--tokenizer``).

It returns a number (a ``float``, an ``int``, a numpy scalar ...) that must be finite. Whatever
it raises, and any other return value, becomes a :class:`~grpo.errors.RewardError` naming it,
with its traceback (:meth:`~grpo.errors.RewardError.user_traceback`).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import numbers
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from grpo.errors import RewardError
from grpo.tokenizers import Tokenizer

__all__ = ["ARGUMENTS", "SIGNATURES", "UserReward", "load_reward", "import_reward"]

#: The names a reward's parameters may have, each meaning what the module docstring says.
ARGUMENTS = ("tokens", "prompt_tokens", "text", "prompt_text")
SIGNATURES = ("reward(tokens)", "reward(tokens, prompt_tokens)",
              "reward(*, tokens=, prompt_tokens=, text=, prompt_text=) (any of these names)")
_TEXT = frozenset({"text", "prompt_text"})


def import_reward(spec: str) -> tuple[Callable[..., Any], str]:
    """(function, name) for ``MODULE:FUNCTION`` or ``path.py:FUNCTION``; ``ValueError``,
    ``ImportError`` or ``AttributeError`` with what is wrong. Exceptions raised while the
    module runs propagate as they are (they are the caller's)."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--reward wants MODULE:FUNCTION or FILE.py:FUNCTION, got {spec!r}")
    if module_name.endswith(".py"):
        path = Path(module_name).expanduser()
        if not path.is_file():
            raise ValueError(f"--reward {spec}: no such file {path}")
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        loader_spec = importlib.util.spec_from_file_location(path.stem, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ValueError(f"--reward {spec}: cannot load {path}")
        module = importlib.util.module_from_spec(loader_spec)
        loader_spec.loader.exec_module(module)
    else:
        here = os.getcwd()
        if here not in sys.path and "" not in sys.path:
            sys.path.insert(0, here)  # the folder the command runs in, as `python -m` does
        importlib.invalidate_caches()
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                raise ImportError(f"--reward {spec}: no module named {exc.name!r} (looked in "
                                  f"{here} and on sys.path)") from None
            raise
    try:
        function = getattr(module, attr)
    except AttributeError:
        raise AttributeError(f"--reward {spec}: {module_name} has no {attr!r}") from None
    if not callable(function):
        raise ValueError(f"--reward {spec}: {attr} is not callable")
    return function, spec


@dataclass(frozen=True)
class UserReward:
    """A caller's reward as the loop calls it: ``reward(tokens, prompt_tokens) -> float``.

    ``keywords``: the arguments passed by keyword (keyword style: its parameters named among
    :data:`ARGUMENTS`, every one of them when it takes ``**kwargs``), or ``None`` when the
    function takes ``positional`` arguments (1: tokens, 2: tokens and prompt tokens).
    ``required_text``: text arguments it cannot do without (so it needs a tokenizer).
    """

    function: Callable[..., Any]
    name: str
    keywords: tuple[str, ...] | None
    positional: int = 0
    tokenizer: Tokenizer | None = None
    required_text: tuple[str, ...] = ()

    @classmethod
    def of(cls, function: Callable[..., Any], name: str | None = None) -> UserReward:
        """Read the signature (module docstring); ``ValueError`` if none of the accepted
        forms fits."""
        name = name if name is not None else str(getattr(function, "__qualname__",
                                                          repr(function)))
        try:
            parameters = list(inspect.signature(function).parameters.values())
        except (TypeError, ValueError):
            return cls(function, name, None, 1)
        named = [p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        required = [p for p in parameters
                    if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        var_keyword = any(p.kind is p.VAR_KEYWORD for p in parameters)
        known = [p.name for p in named if p.name in ARGUMENTS]
        if all(p.name in ARGUMENTS and p.kind is not p.POSITIONAL_ONLY for p in required) \
                and (known or var_keyword):
            return cls(function, name, tuple(ARGUMENTS) if var_keyword else tuple(known),
                       required_text=tuple(p.name for p in required if p.name in _TEXT))
        positional = [p for p in required if p.kind in (p.POSITIONAL_ONLY,
                                                         p.POSITIONAL_OR_KEYWORD)]
        if len(positional) in (1, 2) and len(positional) == len(required):
            return cls(function, name, None, len(positional))
        raise ValueError(f"{name}: a reward takes {SIGNATURES[0]}, {SIGNATURES[1]}, or "
                         f"keywords among {', '.join(ARGUMENTS)}; this one requires "
                         f"({', '.join(p.name for p in required)})")

    @property
    def needs_tokenizer(self) -> bool:
        """Whether it requires ``text`` or ``prompt_text`` (given only with a tokenizer)."""
        return bool(self.required_text)

    def with_tokenizer(self, tokenizer: Tokenizer | None) -> UserReward:
        """This reward decoding with ``tokenizer`` (``ValueError`` if it needs one and gets
        none)."""
        if tokenizer is None and self.needs_tokenizer:
            raise ValueError(f"the reward {self.name} takes text, which needs a tokenizer: "
                             f"pass --tokenizer (byte, or a tokenizer.json)")
        return replace(self, tokenizer=tokenizer)

    def __call__(self, tokens: Sequence[int], prompt_tokens: Sequence[int]) -> float:
        args: tuple[list[int], ...]
        if self.keywords is None:
            args = (list(tokens),) if self.positional == 1 else (list(tokens), list(prompt_tokens))
            kwargs: dict[str, Any] = {}
        else:
            args = ()
            available: dict[str, Callable[[], Any]] = {
                "tokens": lambda: list(tokens), "prompt_tokens": lambda: list(prompt_tokens)}
            if self.tokenizer is not None:
                tokenizer = self.tokenizer
                available["text"] = lambda: tokenizer.decode(tokens)
                available["prompt_text"] = lambda: tokenizer.decode(prompt_tokens)
            kwargs = {k: available[k]() for k in self.keywords if k in available}
        try:
            value = self.function(*args, **kwargs)
        except Exception as exc:
            raise RewardError(f"your reward {self.name} raised {type(exc).__name__}: {exc}",
                              reward=self.name, original=exc) from exc
        return checked_reward(value, self.name)


def checked_reward(value: object, name: str) -> float:
    """``value`` as a finite float, else :class:`RewardError` naming the reward."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RewardError(f"your reward {name} returned {value!r} ({type(value).__name__}); "
                          f"a reward is a finite number", reward=name)
    number = float(value)
    if not math.isfinite(number):
        raise RewardError(f"your reward {name} returned {number}; a reward is a finite number",
                          reward=name)
    return number


def load_reward(spec: str, tokenizer: Tokenizer | None = None) -> UserReward:
    """``--reward``: import (:func:`import_reward`), read the signature
    (:meth:`UserReward.of`) and bind ``tokenizer`` (needed only by text rewards)."""
    function, name = import_reward(spec)
    return UserReward.of(function, name).with_tokenizer(tokenizer)
