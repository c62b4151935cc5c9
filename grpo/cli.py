"""``whitney-grpo`` / ``python -m grpo``: train a LoRA with GRPO (or a variant) on a toy task.

With no arguments it runs the default task (``syllables``) against the embedded mock, prints
one table row per cycle as it completes, writes ``metrics.jsonl`` and the exported adapter to
``--out`` and lists the export files. ``--base-url``/``--api-key`` (or ``WHITNEY_BASE_URL``/
``WHITNEY_API_KEY``) target a real endpoint; ``--reward``, ``--prompts`` and ``--tokenizer``
plug in your own task, for any base model.

Nothing about the model is a constant here: the base model is ``--base-model`` or the server's
only one, and its EOS, vocabulary and context length come from ``GET /capabilities``; BOS from
the tokenizer (:mod:`grpo.tokenizers`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, TextIO

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from grpo.algorithms import ALGORITHMS, UniformRewardError, get_algorithm
from grpo.checks import choose_base_model
from grpo.client import WhitneyClient
from grpo.config import DEFAULT_ADAMW, AdamW, LoopConfig
from grpo.errors import CapabilityError, RewardError, TrainingError, WhitneyClientError
from grpo.loop import CycleMetrics, train
from grpo.rewards import ARGUMENTS, UserReward, import_reward, load_reward
from grpo.tasks import TASKS, Reward, get_task
from grpo.tokenizers import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer

__all__ = ["main", "load_reward", "read_prompts", "read_token_prompts"]

REWARD_HELP = (
    "your reward: MODULE:FUNCTION (imported with the current folder on sys.path) or "
    "FILE.py:FUNCTION. It receives the completion's token ids as sampled (ints; the stop "
    "token, EOS, included when it stopped there) and returns a finite number. Accepted "
    "signatures: reward(tokens) (the seed's); reward(tokens, prompt_tokens); or parameters "
    f"named among {', '.join(ARGUMENTS)} (any of them, by keyword; **kwargs gets all), where "
    "text is the completion decoded by --tokenizer (the text before EOS, special tokens left "
    "out, ids the tokenizer cannot decode shown as <id:N>) and prompt_text the prompt decoded "
    "alike, e.g. reward(text) or reward(text, tokens). An exception in it stops the run: "
    "reported as yours with its traceback, the run checkpointed (after a step) and cleaned up")


def read_prompts(path: str) -> list[str]:
    """One prompt per line (UTF-8); blank lines are skipped."""
    prompts = [line.rstrip("\r\n") for line in Path(path).read_text("utf-8").splitlines()]
    prompts = [prompt for prompt in prompts if prompt.strip()]
    if not prompts:
        raise ValueError(f"{path} holds no prompt")
    return prompts


def read_token_prompts(path: str) -> list[list[int]]:
    """JSONL: one ``{"token_ids": [int, ...]}`` object a line (other keys are ignored), blank
    lines skipped. The ids are sent as they are: no tokenizer, no BOS added."""
    prompts: list[list[int]] = []
    for number, line in enumerate(Path(path).read_text("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            document = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON ({exc.msg})") from None
        ids = document.get("token_ids") if isinstance(document, dict) else None
        if not isinstance(ids, list) or not ids or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise ValueError(f"{where}: expected {{\"token_ids\": [non-negative integers, at "
                             f"least one]}}")
        prompts.append(ids)
    if not prompts:
        raise ValueError(f"{path} holds no prompt")
    return prompts


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown only where there is one; lines wrapped at spaces only (a declaration's
    syntax stays in one piece)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_long_words=False)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, [], False):
            return action.help
        return super()._get_help_string(action)


def _parser() -> argparse.ArgumentParser:
    defaults = LoopConfig()
    parser = argparse.ArgumentParser(
        prog="whitney-grpo", formatter_class=_HelpFormatter,
        description="Train a LoRA with GRPO (or a variant) against Whitney: the embedded mock "
                    "by default, or --base-url. Your task: --reward, --prompts, --tokenizer.")
    parser.add_argument("--base-url", default=argparse.SUPPRESS,
                        help="Whitney endpoint: the server root or the root plus /v1/training "
                             "(what the mock's banner prints); else $WHITNEY_BASE_URL, else "
                             "the embedded mock")
    parser.add_argument("--api-key", default=argparse.SUPPRESS,
                        help="API key; else $WHITNEY_API_KEY")
    parser.add_argument("--algorithm", choices=sorted(ALGORITHMS), default="grpo",
                        help="build_loss variant (see grpo.algorithms)")
    parser.add_argument("--kl-coef", type=float, default=0.0,
                        help="KL penalty against version 0, folded into the advantages")
    parser.add_argument("--task", choices=sorted(TASKS), default="syllables",
                        help="built-in byte task (prompts + reward, byte tokenizer); "
                             "--reward/--prompts replace it")
    parser.add_argument("--reward", metavar="MODULE:FUNCTION", help=REWARD_HELP)
    parser.add_argument("--prompts", metavar="FILE",
                        help="your prompts: text, one per line (tokenized by --tokenizer, BOS "
                             "first when the tokenizer has one), or JSONL lines "
                             "{\"token_ids\": [...]} sent as they are (no tokenizer needed); "
                             "JSONL when the name ends in .jsonl, or see --prompt-format")
    parser.add_argument("--prompt-format", choices=("auto", "text", "jsonl"), default="auto",
                        help="how to read --prompts; auto: jsonl for *.jsonl, else text")
    parser.add_argument("--tokenizer", metavar="byte|PATH", default=None,
                        help="byte (UTF-8 bytes are ids 0..255; needs a vocabulary of 256+), "
                             "or a Hugging Face tokenizer.json or a folder holding one (loaded "
                             "offline with the tokenizers library). Default: byte for text "
                             "prompts, none for token-id prompts. Without --base-url, a folder "
                             "that also holds config.json is the embedded mock's base model "
                             "(as --mock-base-model-from)")
    parser.add_argument("--cycles", type=int, default=defaults.cycles,
                        help="save -> sample -> forward_backward -> optim_step cycles (>= 2)")
    parser.add_argument("--group-size", type=int, default=defaults.group_size,
                        help="completions sampled per prompt (one advantage group)")
    parser.add_argument("--prompts-per-cycle", type=int, default=defaults.prompts_per_cycle,
                        help="prompts (groups) per cycle")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="completion length (default: the task's, 12 tokens)")
    parser.add_argument("--temperature", type=float, default=defaults.temperature,
                        help="sampling temperature")
    parser.add_argument("--learning-rate", type=float, default=DEFAULT_ADAMW.learning_rate,
                        help="AdamW learning rate (the other AdamW fields are sent explicitly too)")
    parser.add_argument("--lora-rank", type=int, default=defaults.lora_rank, help="LoRA rank")
    parser.add_argument("--updates-per-cycle", type=int, default=defaults.updates_per_cycle,
                        help="optimizer steps per batch of samples (ppo/cispo/dro clip "
                        "only from the second)")
    parser.add_argument("--base-model", default=None,
                        help="base model id from GET /capabilities (default: the server's only "
                             "one; with several, the error lists them)")
    parser.add_argument("--mock-base-model", action="append", default=[], metavar="SPEC",
                        help="embedded mock only: serve this base model, "
                             "ID:vocab_size=N,eos=N[,bos=N][,max_context=N][,max_lora_rank=N] "
                             "(as python -m mock_server --base-model); repeatable")
    parser.add_argument("--mock-base-model-from", action="append", default=[],
                        metavar="[ID=]DIR",
                        help="embedded mock only: serve the base model of a local Hugging Face "
                             "model folder (as python -m mock_server --base-model-from); "
                             "repeatable")
    parser.add_argument("--seed", type=int, default=defaults.seed,
                        help="seed of the LoRA init, the sampling seeds and the embedded mock")
    parser.add_argument("--skip-uniform-groups", action="store_true",
                        help="drop groups with equal rewards instead of stopping (counted)")
    parser.add_argument("--out", default="whitney-grpo-out",
                        help="directory for metrics.jsonl and the exported adapter")
    return parser


_COLUMNS = ("cycle", "version", "step", "reward", "std", "loss", "grad", "skip", "sec",
            "example")
_WIDTHS = (5, 7, 4, 6, 5, 8, 7, 4, 5, 0)


class _CycleTable:
    """The per-cycle table: a live ``rich`` table on a terminal, aligned lines elsewhere
    (pipes, CI logs), one row as each cycle completes."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.live: Live | None = None
        if getattr(stream, "isatty", lambda: False)():
            self.table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
            for name, width in zip(_COLUMNS, _WIDTHS, strict=False):
                self.table.add_column(name, justify="right" if width else "left",
                                      min_width=width or 12, no_wrap=True)
            self.live = Live(self.table, console=Console(file=stream), refresh_per_second=8)
            self.live.start()
        else:
            self._line(_COLUMNS)

    def _line(self, cells: Sequence[str]) -> None:
        print(" ".join(f"{cell:>{width}}" if width else cell
                       for cell, width in zip(cells, _WIDTHS, strict=False)),
              file=self.stream, flush=True)

    def add(self, row: CycleMetrics, example: str) -> None:
        shown = example.encode("unicode_escape").decode("ascii")
        cells = (str(row.cycle), str(row.version), str(row.step), f"{row.reward_mean:.3f}",
                 f"{row.reward_std:.3f}", f"{row.loss:.1f}", f"{row.grad_norm:.1f}",
                 str(row.groups_skipped), f"{row.seconds:.3f}", shown[:24])
        if self.live is not None:
            self.table.add_row(*cells)
            self.live.refresh()
        else:
            self._line(cells)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


class _Refused(Exception):
    """A problem with the arguments or the target, found before any session: exit 2."""


def _prompt_format(args: argparse.Namespace) -> str:
    if args.prompt_format != "auto":
        return str(args.prompt_format)
    return "jsonl" if args.prompts and args.prompts.lower().endswith(".jsonl") else "text"


def _model_folder(tokenizer_spec: str | None) -> str | None:
    """The folder of ``--tokenizer`` when it is a Hugging Face model folder (config.json)."""
    if tokenizer_spec is None or tokenizer_spec == "byte":
        return None
    path = Path(tokenizer_spec).expanduser()
    folder = path if path.is_dir() else path.parent
    return str(folder) if (folder / "config.json").is_file() else None


def _connect(args: argparse.Namespace) -> tuple[WhitneyClient, str]:
    """The client and a description of the target (the embedded mock with the declared base
    models when no base URL is given)."""
    base_url = getattr(args, "base_url", None) or os.environ.get("WHITNEY_BASE_URL")
    api_key = getattr(args, "api_key", None)
    declared, folders = list(args.mock_base_model), list(args.mock_base_model_from)
    if base_url:
        if declared or folders:
            raise _Refused("--mock-base-model/--mock-base-model-from declare the embedded mock's "
                           "models; with --base-url the server declares its own")
        return WhitneyClient.connect(base_url, api_key), base_url
    auto = _model_folder(args.tokenizer)
    note = ""
    if not declared and not folders and auto is not None:
        folders = [auto]  # the tokenizer's model folder is the embedded mock's base model
        note = f" declaring the model of {auto}"
    from grpo.embedded import embedded_http_client

    http = embedded_http_client(api_key=api_key or os.environ.get("WHITNEY_API_KEY"),
                                seed=args.seed, base_models=declared, base_models_from=folders)
    return WhitneyClient(http), f"embedded mock{note}"


def _reward_and_prompts(args: argparse.Namespace, task: Any, tokenizer: Tokenizer | None,
                        model: dict[str, Any], prompt_source: list[str] | list[list[int]],
                        user_reward: UserReward | None) -> tuple[Reward, list[list[int]]]:
    """The loop's reward and token prompts, for the bound tokenizer and the chosen model."""
    if user_reward is not None:
        try:
            reward: Reward = user_reward.with_tokenizer(tokenizer)
        except ValueError as exc:
            raise _Refused(str(exc)) from None
    else:
        if not isinstance(tokenizer, ByteTokenizer):
            raise _Refused(f"the built-in task {task.name!r} is a byte task: use --tokenizer "
                           f"byte, or pass --reward")
        reward = task.reward_for(int(model["eos_token_id"]))
    if _prompt_format(args) == "jsonl":
        return reward, [list(p) for p in prompt_source]  # type: ignore[arg-type]
    assert tokenizer is not None
    return reward, [tokenizer.encode(str(text)) for text in prompt_source]


def main(argv: list[str] | None = None, *, stdout: TextIO | None = None) -> int:
    """Entry point; returns the process exit code (0 done, 1 training failed, 2 refused)."""
    try:
        return _main(argv, stdout or sys.stdout)
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _main(argv: list[str] | None, out_stream: TextIO) -> int:
    args = _parser().parse_args(argv)

    def say(text: str) -> None:
        print(text, file=out_stream, flush=True)

    task = get_task(args.task)
    jsonl = _prompt_format(args) == "jsonl"
    user_reward: UserReward | None = None
    try:
        if args.reward:
            function, name = import_reward(args.reward)
            user_reward = UserReward.of(function, name)
        prompt_source: list[str] | list[list[int]] = (
            read_token_prompts(args.prompts) if jsonl else read_prompts(args.prompts)
        ) if args.prompts else list(task.prompts)
        tokenizer_spec = args.tokenizer if args.tokenizer or jsonl else "byte"
        unbound = load_tokenizer(tokenizer_spec) if tokenizer_spec else None
        if user_reward is not None and unbound is None and user_reward.needs_tokenizer:
            raise ValueError(f"the reward {user_reward.name} takes text, which needs a "
                             f"tokenizer: pass --tokenizer (byte, or a tokenizer.json)")
        config = LoopConfig(
            cycles=args.cycles,
            group_size=args.group_size,
            prompts_per_cycle=args.prompts_per_cycle,
            max_tokens=args.max_tokens or task.length,
            temperature=args.temperature,
            base_model=args.base_model,
            lora_rank=args.lora_rank,
            lora_alpha=2.0 * args.lora_rank,
            adamw=AdamW(**{**DEFAULT_ADAMW.to_json(), "learning_rate": args.learning_rate}),
            seed=args.seed,
            updates_per_cycle=args.updates_per_cycle,
            skip_uniform_groups=args.skip_uniform_groups,
        )
        algorithm = get_algorithm(args.algorithm, kl_coef=args.kl_coef)
        client, target = _connect(args)
    except (ValueError, ImportError, AttributeError, OSError, _Refused) as exc:
        say(f"whitney-grpo: {exc}")
        return 2

    with client:
        try:
            capabilities = client.capabilities()
            model = choose_base_model(capabilities, config.base_model)
            tokenizer = unbound.bind(model) if unbound is not None else None
            reward, prompts = _reward_and_prompts(args, task, tokenizer, model, prompt_source,
                                                  user_reward)
        except (CapabilityError, ValueError, _Refused) as exc:
            say(f"whitney-grpo: refused before creating a session: {exc}")
            return 2
        except WhitneyClientError as exc:
            say(f"whitney-grpo: {exc}")
            return 1
        return _train(args, client, target, config, algorithm, tokenizer, model, reward,
                      prompts, say, out_stream)


def _describe(tokenizer: Tokenizer | None, tokens: Sequence[int]) -> str:
    """A completion as shown in the table and metrics: decoded text, or its ids."""
    if tokenizer is None:
        return " ".join(str(t) for t in tokens)
    return tokenizer.decode(tokens)


def _train(args: argparse.Namespace, client: WhitneyClient, target: str, config: LoopConfig,
           algorithm: Any, tokenizer: Tokenizer | None, model: dict[str, Any], reward: Reward,
           prompts: list[list[int]], say: Any, out_stream: TextIO) -> int:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = out_dir / "metrics.jsonl"
    numbers = ", ".join(f"{key} {value}" for key, value in model.items() if key != "id")
    tokenizer_name = "none (token-id prompts)" if tokenizer is None else (
        tokenizer.name if not isinstance(tokenizer, HFTokenizer) else str(tokenizer.file))
    say(f"whitney-grpo: {algorithm.name} on task {args.reward or args.task!r}, "
        f"{config.cycles} cycles x {min(config.prompts_per_cycle, len(prompts))} prompts "
        f"x {config.group_size} samples, target {target}")
    say(f"  base model {model['id']} ({numbers}); tokenizer {tokenizer_name}, BOS "
        f"{getattr(tokenizer, 'bos_token_id', None)}")
    table = _CycleTable(out_stream)
    with metrics_path.open("w", encoding="utf-8") as metrics_file:

        def on_cycle(row: CycleMetrics) -> None:
            example = _describe(tokenizer, row.example)
            table.add(row, example)
            record = {**asdict(row), "example": example if tokenizer else row.example,
                      "algorithm": algorithm.name, "base_model": model["id"]}
            metrics_file.write(json.dumps(record) + "\n")
            metrics_file.flush()

        try:
            try:
                result = train(client, prompts, reward, algorithm,
                               replace(config, base_model=model["id"]), on_cycle=on_cycle)
            finally:
                table.close()
        except CapabilityError as exc:
            say(f"whitney-grpo: refused before creating a session: {exc}")
            return 2
        except TrainingError as exc:
            cause = exc.__cause__
            say(f"whitney-grpo: {exc}")
            if isinstance(cause, RewardError) and cause.user_traceback():
                say(cause.user_traceback().rstrip("\n"))  # the reward's own frames
            if exc.checkpoint is not None:
                say(f"  checkpoint {exc.checkpoint['checkpoint_id']} (step "
                    f"{exc.checkpoint['step']}) of run {exc.run_id}, saved before the cancel: "
                    f"load_state it in a new run of this API key to continue")
            if isinstance(cause, UniformRewardError) and not config.skip_uniform_groups:
                say("  (pass --skip-uniform-groups to drop such groups from multi-prompt cycles)")
            return 1
        except WhitneyClientError as exc:
            say(f"whitney-grpo: {exc}")
            return 1

    rewards = [row.reward_mean for row in result.metrics]
    window = min(5, len(rewards) // 2)
    say(f"mean reward, first {window} cycles {statistics.fmean(rewards[:window]):.3f} -> "
        f"last {window} cycles {statistics.fmean(rewards[-window:]):.3f}; "
        f"{statistics.fmean(row.seconds for row in result.metrics):.3f} s/cycle")
    say(f"run {result.run_id} {result.run['state']}, checkpoint "
        f"{result.checkpoint['checkpoint_id']} (step {result.checkpoint['step']}), "
        f"export {result.export['export_id']} ({result.export['format']}):")
    for file in result.export["files"]:
        path = out_dir / file["name"]
        path.write_bytes(result.files[file["name"]])
        say(f"  {path}  {file['bytes']} bytes  sha256 {file['sha256']}")
    say(f"  {metrics_path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
