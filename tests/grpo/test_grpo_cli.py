"""``whitney-grpo`` / ``python -m grpo``: plug-in reward and prompts, metrics file, exit codes;
the byte tokenizer and the toy tasks' rewards against hand-worked examples."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpo.cli import load_reward, main, read_prompts
from grpo.tasks import TASKS, ByteTokenizer, get_task

TOKENIZER = ByteTokenizer()


def run_cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(args), stdout=out)
    return code, out.getvalue()


def test_plugged_reward_and_prompts_are_used(tmp_path):
    (tmp_path / "my_reward.py").write_text(
        "def reward(tokens):\n"
        "    return float(len(tokens)) + 0.001 * tokens[0]\n")
    (tmp_path / "prompts.txt").write_text("hello\n\nworld\n")
    code, printed = run_cli("--reward", f"{tmp_path / 'my_reward.py'}:reward",
                            "--prompts", str(tmp_path / "prompts.txt"), "--cycles", "3",
                            "--group-size", "4", "--out", str(tmp_path / "out"))
    assert code == 0, printed
    rows = [json.loads(line)
            for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for row in rows:
        assert row["groups"] == 2  # two prompts in the file, four asked per cycle
        # the plugged reward is length + 0.001·first token (< 0.26): the loop's own
        # completion-length count, from the sample, must sit just under it
        assert 0 <= row["reward_mean"] - row["completion_length"] < 0.26
    for file in ("adapter_model.safetensors", "adapter_config.json"):
        content = (tmp_path / "out" / file).read_bytes()
        assert hashlib.sha256(content).hexdigest() in printed


def test_invalid_configuration_exits_2_before_anything_runs(tmp_path):
    code, printed = run_cli("--cycles", "1", "--out", str(tmp_path))
    assert code == 2 and "two cycles" in printed
    assert not (tmp_path / "metrics.jsonl").exists()
    code, printed = run_cli("--reward", "no_such_module_xyz:reward", "--out", str(tmp_path))
    assert code == 2 and "no_such_module_xyz" in printed


def test_uniform_group_exits_1_with_the_opt_in_hint(tmp_path):
    (tmp_path / "flat.py").write_text("def reward(tokens, prompt_tokens):\n    return 1.0\n")
    code, printed = run_cli("--reward", f"{tmp_path / 'flat.py'}:reward", "--cycles", "2",
                            "--out", str(tmp_path / "out"))
    assert code == 1
    assert "cycle 0" in printed and "uniform" in printed and "--skip-uniform-groups" in printed


def test_load_reward_accepts_the_seed_signature_and_the_prompt_aware_one(tmp_path):
    (tmp_path / "rewards.py").write_text(
        "def seed_style(tokens):\n    return float(len(tokens))\n"
        "def with_prompt(tokens, prompt_tokens):\n    return float(len(prompt_tokens))\n"
        "def too_many(a, b, c):\n    return 0.0\n")
    module = f"{tmp_path / 'rewards.py'}"
    assert load_reward(f"{module}:seed_style")([1, 2, 3], [256]) == 3.0
    assert load_reward(f"{module}:with_prompt")([1, 2, 3], [256]) == 1.0
    with pytest.raises(ValueError, match=r"this one requires \(a, b, c\)"):
        load_reward(f"{module}:too_many")
    with pytest.raises(ValueError, match="MODULE:FUNCTION"):
        load_reward("no_colon")
    (tmp_path / "empty.txt").write_text("\n  \n")
    with pytest.raises(ValueError, match="no prompt"):
        read_prompts(str(tmp_path / "empty.txt"))


def test_python_dash_m_grpo_help_runs():
    done = subprocess.run([sys.executable, "-m", "grpo", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "--reward MODULE:FUNCTION" in done.stdout


@given(st.text(max_size=30))
def test_tokenizer_round_trips_text(text):
    tokens = TOKENIZER.encode(text)
    assert tokens[0] == 256 and all(0 <= t < 256 for t in tokens[1:])
    assert TOKENIZER.decode(tokens) == text
    assert TOKENIZER.decode(tokens + [257] + TOKENIZER.encode("tail", add_bos=False)) == text


def score(task: str, completion: str, prompt: str, eos: bool = False) -> float:
    tokens = list(completion.encode()) + ([257] if eos else [])
    return get_task(task).reward(tokens, TOKENIZER.encode(prompt))


@pytest.mark.parametrize(("task", "prompt", "completion", "points"), [
    ("syllables", "cat", "abababababab", 12),   # t->a vowel, a->b consonant, ...
    ("syllables", "sea", "babababababa", 12),   # a->b, b->a, ...
    ("syllables", "cat", "bbbbbbbbbbbb", 0),
    ("syllables", "cat", "a bababababa", 10),   # ' ' is no consonant, b after ' ' no vowel
    ("syllables", "cat", "aaaa", 1),            # only the first a alternates; 8 left unsaid
    ("vowels", "dog", "aeiouxaeiouz", 10),
    ("vowels", "dog", "AEIOU", 0),
    ("case", "DOG", "ABCdefGHIjk!", 6),
    ("case", "dog", "ABCdefGHIjk!", 5),
])
def test_toy_rewards_count_points_over_the_task_length(task, prompt, completion, points):
    assert score(task, completion, prompt) == pytest.approx(points / 12)


def test_completion_stops_at_eos_and_only_the_task_length_is_scored():
    assert score("vowels", "aaaa", "x", eos=True) == pytest.approx(4 / 12)
    assert score("vowels", "a" * 20, "x") == 1.0
    assert set(TASKS) == {"syllables", "vowels", "case"}
    with pytest.raises(ValueError, match="unknown task"):
        get_task("chess")
