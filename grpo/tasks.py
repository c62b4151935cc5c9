"""Toy byte tasks with verifiable rewards for ``whitney-mock/tiny-byte`` (and any model whose
vocabulary holds the 256 byte ids), tokenized with :class:`~grpo.tokenizers.ByteTokenizer`.

A reward is ``reward(tokens, prompt_tokens) -> float``: ``tokens`` is one sampled completion
(as in the seed's ``reward(tokens)``), ``prompt_tokens`` the prompt it answers. A task's
reward stops at EOS: ``Task.reward_for(eos_token_id)`` takes the server's (the CLI passes the
capabilities' value); ``Task.reward`` is the one for ``whitney-mock/tiny-byte``. Each toy task
scores the first ``length`` completion characters, one point per character that obeys the
task's rule, divided by ``length``: rewards lie in [0, 1], a completion that stops early (EOS)
forfeits the rest, and the many reward levels make groups of equal rewards rare.

The tasks were picked so that the tiny model learns them in tens of cycles (see the report in
``tests/grpo/test_grpo_learning.py``): its features are the current token, the previous token and
a running average of the prefix, so rules about the next character given the current one
(``syllables``, ``vowels``) are learnable quickly, and ``case`` needs the prompt.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from grpo.tokenizers import ByteTokenizer

__all__ = ["ByteTokenizer", "Task", "TASKS", "get_task", "Reward"]

Reward = Callable[[Sequence[int], Sequence[int]], float]

VOWELS = frozenset(b"aeiou")
CONSONANTS = frozenset(string.ascii_lowercase.encode()) - VOWELS
LOWER = frozenset(string.ascii_lowercase.encode())
UPPER = frozenset(string.ascii_uppercase.encode())


def _text_bytes(tokens: Sequence[int], length: int, eos_token_id: int) -> list[int]:
    """The first ``length`` completion tokens before EOS."""
    kept: list[int] = []
    for token in tokens[:length]:
        if token == eos_token_id:
            break
        kept.append(token)
    return kept


@dataclass(frozen=True)
class Task:
    """A prompt set, a reward (``make_reward(length, eos_token_id)``) and the completion
    length the reward scores."""

    name: str
    description: str
    prompts: tuple[str, ...]
    make_reward: Callable[[int, int], Reward]
    length: int

    def reward_for(self, eos_token_id: int) -> Reward:
        """The task's reward for a model whose EOS is ``eos_token_id``."""
        return self.make_reward(self.length, eos_token_id)

    @property
    def reward(self) -> Reward:
        """The reward for ``whitney-mock/tiny-byte`` (its EOS: the byte tokenizer's default)."""
        eos = ByteTokenizer().eos_token_id
        assert eos is not None
        return self.reward_for(eos)


def syllables_reward(length: int, eos_token_id: int) -> Reward:
    """One point per character that switches between consonant and vowel: a vowel after a
    non-vowel (the prompt's last character counts), a consonant after a vowel."""

    def reward(tokens: Sequence[int], prompt_tokens: Sequence[int]) -> float:
        previous = prompt_tokens[-1] if prompt_tokens else -1
        points = 0
        for token in _text_bytes(tokens, length, eos_token_id):
            if (previous in VOWELS and token in CONSONANTS) or (
                previous not in VOWELS and token in VOWELS
            ):
                points += 1
            previous = token
        return points / length

    return reward


def vowels_reward(length: int, eos_token_id: int) -> Reward:
    """One point per vowel (a, e, i, o, u)."""

    def reward(tokens: Sequence[int], prompt_tokens: Sequence[int]) -> float:
        return sum(token in VOWELS for token in _text_bytes(tokens, length, eos_token_id)) / length

    return reward


def case_reward(length: int, eos_token_id: int) -> Reward:
    """One point per letter in the prompt's case (upper-case prompt: upper-case letters)."""

    def reward(tokens: Sequence[int], prompt_tokens: Sequence[int]) -> float:
        prompt_letters = [token for token in prompt_tokens if token in LOWER | UPPER]
        wanted = UPPER if prompt_letters and all(t in UPPER for t in prompt_letters) else LOWER
        return sum(token in wanted for token in _text_bytes(tokens, length, eos_token_id)) / length

    return reward


_WORDS = ("cat", "dog", "sun", "tree", "map", "fish", "blue", "rock", "sea", "hill")

TASKS: dict[str, Task] = {
    "syllables": Task(
        "syllables",
        "alternate consonants and vowels (banotile...)",
        _WORDS,
        syllables_reward,
        12,
    ),
    "vowels": Task("vowels", "answer with vowels only", _WORDS, vowels_reward, 12),
    "case": Task(
        "case",
        "answer in the prompt's case",
        tuple(word.upper() if i % 2 else word for i, word in enumerate(_WORDS)),
        case_reward,
        12,
    ),
}


def get_task(name: str) -> Task:
    """A task of :data:`TASKS` by name."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; choose from {sorted(TASKS)}") from None
