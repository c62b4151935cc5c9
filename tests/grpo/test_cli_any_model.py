"""``whitney-grpo`` against any base model (issue 13), run in-process through ``main``:

- a BPE tokenizer trained here with ``tokenizers``, in a Hugging Face folder written here,
  declared in the embedded mock from that folder: the reward, defined over decoded text,
  rises;
- token-id prompts (JSONL) against a mock declared with a 32-token vocabulary, no tokenizer;
- a model vocabulary padded beyond the tokenizer's: undecodable ids are shown as ``<id:N>``;
- the user's reward raising: reported as theirs with their traceback, checkpoint saved, run
  cancelled, session closed (seen from the mock's side);
- ``--reward module:function`` from the current folder; the default base model.

Independent references: the rewards log what they receive, and the test decodes the same ids
with the ``tokenizers`` library directly; the served mock's own records show the cleanup.
"""

from __future__ import annotations

import io
import json
import statistics
import uuid
from pathlib import Path
from typing import Any

import pytest
from model_folders import write_model_folder
from tokenizers import Tokenizer

from grpo.cli import main
from mock_server.testing import MockWhitney

MARGIN = 0.15

VOWEL_REWARD = '''
import json

LOG = {log!r}

def reward(text, tokens):
    """Share of the decoded completion's letters that are vowels (0 with no letter)."""
    with open(LOG, "a", encoding="utf-8") as log:
        log.write(json.dumps({{"text": text, "tokens": tokens}}) + "\\n")
    letters = [c for c in text if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0
'''


def run_cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(args), stdout=out)
    return code, out.getvalue()


def metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def logged(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def reference_text(tokenizer: Tokenizer, tokens: list[int], eos: int) -> str:
    """What the reward must receive: the tokens before EOS, decoded by the library, special
    tokens left out, an id the tokenizer does not have shown as <id:N>."""
    parts, run = [], []
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    for token in tokens:
        if token == eos:
            break
        if token < size:
            run.append(token)
        else:
            parts.append(tokenizer.decode(run, skip_special_tokens=True) if run else "")
            parts.append(f"<id:{token}>")
            run = []
    parts.append(tokenizer.decode(run, skip_special_tokens=True) if run else "")
    return "".join(parts)


PROMPTS = "the cat\na bird\nwe hope\nold oak\nrain fell\nqueen eve\n"


def test_text_task_reward_rises_with_a_bpe_tokenizer_from_a_model_folder(tmp_path: Path) -> None:
    folder = write_model_folder(tmp_path / "tiny-bpe")
    log = tmp_path / "seen.jsonl"
    (tmp_path / "vowels.py").write_text(VOWEL_REWARD.format(log=str(log)))
    (tmp_path / "prompts.txt").write_text(PROMPTS)
    code, printed = run_cli(
        "--tokenizer", str(folder.path), "--prompts", str(tmp_path / "prompts.txt"),
        "--reward", f"{tmp_path / 'vowels.py'}:reward", "--cycles", "20",
        "--skip-uniform-groups", "--out", str(tmp_path / "out"))
    assert code == 0, printed
    assert "embedded mock declaring the model of" in printed
    rows = metrics(tmp_path / "out")
    rewards = [row["reward_mean"] for row in rows]
    first, last = statistics.fmean(rewards[:5]), statistics.fmean(rewards[-5:])
    assert last - first >= MARGIN, rewards
    assert {row["base_model"] for row in rows} == {"tiny-bpe"}
    # the reward got the library's decoding of exactly the sampled ids, EOS from capabilities
    library = Tokenizer.from_file(str(folder.path / "tokenizer.json"))
    seen = logged(log)
    assert len(seen) == 20 * 4 * 8
    for entry in seen:
        assert all(0 <= t < folder.vocab_size for t in entry["tokens"])
        assert entry["text"] == reference_text(library, entry["tokens"], folder.eos_token_id)
    assert any(e["tokens"][-1] == folder.eos_token_id for e in seen)  # EOS stops, is included
    assert "<id:" not in "".join(e["text"] for e in seen)  # the model's ids = the tokenizer's


def test_token_id_prompts_against_a_32_token_vocabulary(tmp_path: Path) -> None:
    (tmp_path / "prompts.jsonl").write_text(
        "\n".join(json.dumps({"token_ids": ids}) for ids in ([30, 1, 2], [30, 9], [30, 17, 4]))
        + "\n")
    (tmp_path / "low.py").write_text(
        "def reward(tokens, prompt_tokens):\n"
        "    assert prompt_tokens[0] == 30 and all(0 <= t < 32 for t in tokens)\n"
        "    body = [t for t in tokens[:8] if t != 31]\n"
        "    return sum(t < 8 for t in body) / 8\n")
    with MockWhitney.serve(base_models=["tiny32:vocab_size=32,eos=31"]) as mock:
        code, printed = run_cli(
            "--base-url", f"{mock.base_url}/v1/training", "--api-key", mock.api_key,
            "--prompts", str(tmp_path / "prompts.jsonl"),
            "--reward", f"{tmp_path / 'low.py'}:reward", "--max-tokens", "8", "--cycles", "12",
            "--skip-uniform-groups", "--out", str(tmp_path / "out"))
        assert code == 0, printed
        (run,) = mock.backend.runs.values()
        assert run.base_model == "tiny32" and run.base.spec.vocab_size == 32
        assert mock.primitives(run.run_id)[:4] == ["save_weights_for_sampler", "sample",
                                                   "sample", "sample"]
        # text prompts need a tokenizer: the byte tokenizer cannot serve 32 ids
        (tmp_path / "prompts.txt").write_text("hello\n")
        refused, said = run_cli("--base-url", mock.base_url, "--api-key", mock.api_key,
                                "--prompts", str(tmp_path / "prompts.txt"),
                                "--reward", f"{tmp_path / 'low.py'}:reward",
                                "--out", str(tmp_path / "out2"))
        assert refused == 2 and "byte tokenizer needs a vocabulary of at least 256" in said
        assert len(mock.backend.sessions) == 1  # refused before creating a session
    rows = metrics(tmp_path / "out")
    assert all(0 <= t < 32 for row in rows for t in row["example"])
    rewards = [row["reward_mean"] for row in rows]
    assert statistics.fmean(rewards[-4:]) > statistics.fmean(rewards[:4]), rewards


def test_padded_vocabulary_decodes_what_it_can(tmp_path: Path) -> None:
    folder = write_model_folder(tmp_path / "padded", tokenizer_vocab=96, model_vocab=4096)
    log = tmp_path / "seen.jsonl"
    (tmp_path / "vowels.py").write_text(VOWEL_REWARD.format(log=str(log)))
    (tmp_path / "prompts.txt").write_text(PROMPTS)
    code, printed = run_cli(
        "--tokenizer", str(folder.path / "tokenizer.json"),
        "--prompts", str(tmp_path / "prompts.txt"), "--reward",
        f"{tmp_path / 'vowels.py'}:reward", "--cycles", "3", "--skip-uniform-groups",
        "--out", str(tmp_path / "out"))
    assert code == 0, printed
    assert "vocab_size 4096" in printed
    library = Tokenizer.from_file(str(folder.path / "tokenizer.json"))
    seen = logged(log)
    beyond = [e for e in seen if any(t >= folder.tokenizer_size for t in e["tokens"])]
    assert beyond, "the mock never sampled an id beyond the tokenizer"
    for entry in seen:
        assert entry["text"] == reference_text(library, entry["tokens"], folder.eos_token_id)
    example = next(e for e in beyond if e["tokens"][0] >= folder.tokenizer_size)
    assert example["text"].startswith(f"<id:{example['tokens'][0]}>")
    assert any("<id:" in row["example"] for row in metrics(tmp_path / "out"))


def test_reward_exception_is_the_users_with_traceback_checkpoint_and_cleanup(
        tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    (tmp_path / "flaky.py").write_text(
        "from pathlib import Path\n"
        f"CALLS = Path({str(calls)!r})\n"
        "def reward(tokens):\n"
        "    CALLS.write_text(str(int(CALLS.read_text() or 0) + 1) if CALLS.exists() else '1')\n"
        "    if int(CALLS.read_text()) > 2 * 4 * 8:  # the third cycle\n"
        "        return {}['oops']\n"
        "    return len(tokens) + 0.001 * tokens[0]\n")
    with MockWhitney.serve() as mock:
        code, printed = run_cli("--base-url", mock.base_url, "--api-key", mock.api_key,
                                "--reward", f"{tmp_path / 'flaky.py'}:reward",
                                "--out", str(tmp_path / "out"))
        (run,) = mock.backend.runs.values()
        (session,) = mock.backend.sessions.values()
        executed = mock.primitives(run.run_id)
        checkpoints = [ckpt for _, ckpt in mock.backend.checkpoints.values()]
    assert code == 1
    assert "build_loss: KeyError" not in printed
    assert f"cycle 2, reward: your reward {tmp_path / 'flaky.py'}:reward raised KeyError: 'oops'" \
        in printed
    assert "Traceback (most recent call last):" in printed
    assert f'File "{tmp_path / "flaky.py"}", line 6, in reward' in printed
    assert "grpo/loop.py" not in printed  # the user's frames only
    assert run.state == "cancelled" and session.state == "closed"
    assert executed[-1] == "save_state" and executed.count("optim_step") == 2
    (checkpoint,) = checkpoints
    assert checkpoint.step == 2
    assert f"checkpoint {checkpoint.checkpoint_id} (step 2) of run {run.run_id}" in printed


def test_reward_module_from_the_current_folder_and_bad_returns(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    name = f"my_reward_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "def reward(tokens, prompt_tokens):\n    return len(tokens) + 0.001 * tokens[0]\n"
        "def broken(tokens):\n    return None\n")
    monkeypatch.chdir(tmp_path)
    code, printed = run_cli("--reward", f"{name}:reward", "--cycles", "2", "--out", "out")
    assert code == 0, printed
    code, printed = run_cli("--reward", f"{name}:broken", "--cycles", "2", "--out", "out")
    assert code == 1 and f"your reward {name}:broken returned None (NoneType)" in printed
    code, printed = run_cli("--reward", "no_such_reward_module_xyz:reward", "--out", "out")
    assert code == 2 and "no module named 'no_such_reward_module_xyz'" in printed


def test_default_base_model_is_the_only_one_else_the_error_lists_them(tmp_path: Path) -> None:
    two = ("--mock-base-model", "whitney-mock/tiny-byte", "--mock-base-model",
           "big:vocab_size=151936,eos=151645,bos=151643")
    code, printed = run_cli(*two, "--cycles", "2", "--out", str(tmp_path))
    assert code == 2
    assert "serves 2 base models ('whitney-mock/tiny-byte', 'big')" in printed
    assert "--base-model" in printed
    (tmp_path / "length.py").write_text("def reward(tokens):\n    return len(tokens) + "
                                        "tokens[0] / 1e6\n")
    code, printed = run_cli(*two, "--base-model", "big", "--cycles", "2", "--out", str(tmp_path),
                            "--reward", f"{tmp_path / 'length.py'}:reward")
    assert code == 0, printed
    assert "base model big (vocab_size 151936" in printed and "BOS 151643" in printed
    assert all(row["base_model"] == "big" for row in metrics(tmp_path))
    code, printed = run_cli("--mock-base-model", "x:vocab_size=1,eos=0", "--out", str(tmp_path))
    assert code == 2 and "vocab_size must be an integer in [2," in printed
