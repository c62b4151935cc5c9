"""``whitney-grpo`` / ``python -m grpo``: train a LoRA with GRPO (or a variant) on a toy task.

With no arguments it runs the default task (``syllables``) against the embedded mock, prints
one table row per cycle as it completes, writes ``metrics.jsonl`` and the exported adapter to
``--out`` and lists the export files. ``--base-url``/``--api-key`` (or ``WHITNEY_BASE_URL``/
``WHITNEY_API_KEY``) target a real endpoint; ``--reward MODULE:FUNCTION`` and ``--prompts FILE``
plug in your own task.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TextIO

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from grpo.algorithms import ALGORITHMS, UniformRewardError, get_algorithm
from grpo.client import WhitneyClient
from grpo.config import DEFAULT_ADAMW, AdamW, LoopConfig
from grpo.errors import CapabilityError, TrainingError, WhitneyClientError
from grpo.loop import CycleMetrics, train
from grpo.tasks import TASKS, ByteTokenizer, Reward, get_task

__all__ = ["main", "load_reward", "read_prompts"]


def load_reward(spec: str) -> Reward:
    """``MODULE:FUNCTION`` (importable module or a ``.py`` path) as a loop reward.

    ``FUNCTION(tokens)`` (the seed's signature) or ``FUNCTION(tokens, prompt_tokens)``; tokens
    are ints (bytes 0..255, BOS 256, EOS 257 on the mock). It must return a finite number.
    """
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--reward wants MODULE:FUNCTION, got {spec!r}")
    if module_name.endswith(".py"):
        path = Path(module_name)
        loader_spec = importlib.util.spec_from_file_location(path.stem, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ValueError(f"cannot load {path}")
        module = importlib.util.module_from_spec(loader_spec)
        loader_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    function = getattr(module, attr)
    parameters = [
        p for p in inspect.signature(function).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(parameters) == 1:
        return lambda tokens, prompt_tokens: float(function(tokens))
    if len(parameters) == 2:
        return lambda tokens, prompt_tokens: float(function(tokens, prompt_tokens))
    raise ValueError(f"{spec}: the reward takes (tokens) or (tokens, prompt_tokens), "
                     f"not {len(parameters)} required arguments")


def read_prompts(path: str) -> list[str]:
    """One prompt per line (UTF-8); blank lines are skipped."""
    prompts = [line.rstrip("\r\n") for line in Path(path).read_text("utf-8").splitlines()]
    prompts = [prompt for prompt in prompts if prompt.strip()]
    if not prompts:
        raise ValueError(f"{path} holds no prompt")
    return prompts


def _parser() -> argparse.ArgumentParser:
    defaults = LoopConfig()
    parser = argparse.ArgumentParser(prog="whitney-grpo", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--base-url", default=argparse.SUPPRESS,
                        help="Whitney endpoint; else $WHITNEY_BASE_URL, else the embedded mock")
    parser.add_argument("--api-key", default=argparse.SUPPRESS,
                        help="API key; else $WHITNEY_API_KEY")
    parser.add_argument("--algorithm", choices=sorted(ALGORITHMS), default="grpo",
                        help="build_loss variant (see grpo.algorithms)")
    parser.add_argument("--kl-coef", type=float, default=0.0,
                        help="KL penalty against version 0, folded into the advantages")
    parser.add_argument("--task", choices=sorted(TASKS), default="syllables",
                        help="built-in toy task (prompts + reward); --reward/--prompts replace it")
    parser.add_argument("--reward", metavar="MODULE:FUNCTION", help="your reward function")
    parser.add_argument("--prompts", metavar="FILE", help="your prompts, one per line")
    parser.add_argument("--cycles", type=int, default=defaults.cycles,
                        help="save -> sample -> forward_backward -> optim_step cycles (>= 2)")
    parser.add_argument("--group-size", type=int, default=defaults.group_size,
                        help="completions sampled per prompt (one advantage group)")
    parser.add_argument("--prompts-per-cycle", type=int, default=defaults.prompts_per_cycle,
                        help="prompts (groups) per cycle")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="completion length (default: the task's)")
    parser.add_argument("--temperature", type=float, default=defaults.temperature,
                        help="sampling temperature")
    parser.add_argument("--learning-rate", type=float, default=DEFAULT_ADAMW.learning_rate,
                        help="AdamW learning rate (the other AdamW fields are sent explicitly too)")
    parser.add_argument("--lora-rank", type=int, default=defaults.lora_rank, help="LoRA rank")
    parser.add_argument("--updates-per-cycle", type=int, default=defaults.updates_per_cycle,
                        help="optimizer steps per batch of samples (ppo/cispo/dro clip "
                        "only from the second)")
    parser.add_argument("--base-model", default=defaults.base_model,
                        help="base model id from GET /capabilities")
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
            for name, width in zip(_COLUMNS, _WIDTHS):
                self.table.add_column(name, justify="right" if width else "left",
                                      min_width=width or 12, no_wrap=True)
            self.live = Live(self.table, console=Console(file=stream), refresh_per_second=8)
            self.live.start()
        else:
            self._line(_COLUMNS)

    def _line(self, cells: Sequence[str]) -> None:
        print(" ".join(f"{cell:>{width}}" if width else cell
                       for cell, width in zip(cells, _WIDTHS)), file=self.stream, flush=True)

    def add(self, row: CycleMetrics, tokenizer: ByteTokenizer) -> None:
        example = tokenizer.decode(row.example).encode("unicode_escape").decode("ascii")
        cells = (str(row.cycle), str(row.version), str(row.step), f"{row.reward_mean:.3f}",
                 f"{row.reward_std:.3f}", f"{row.loss:.1f}", f"{row.grad_norm:.1f}",
                 str(row.groups_skipped), f"{row.seconds:.3f}", example[:24])
        if self.live is not None:
            self.table.add_row(*cells)
            self.live.refresh()
        else:
            self._line(cells)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


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
    tokenizer = ByteTokenizer()
    try:
        reward = load_reward(args.reward) if args.reward else task.reward
        prompt_texts = read_prompts(args.prompts) if args.prompts else list(task.prompts)
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
    except (ValueError, ImportError, AttributeError, OSError) as exc:
        say(f"whitney-grpo: {exc}")
        return 2

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = out_dir / "metrics.jsonl"
    base_url, api_key = getattr(args, "base_url", None), getattr(args, "api_key", None)
    target = base_url or os.environ.get("WHITNEY_BASE_URL") or "embedded mock"
    say(f"whitney-grpo: {algorithm.name} on task {args.reward or args.task!r}, "
        f"{config.cycles} cycles x {min(config.prompts_per_cycle, len(prompt_texts))} prompts "
        f"x {config.group_size} samples, target {target}")
    table = _CycleTable(out_stream)
    with metrics_path.open("w", encoding="utf-8") as metrics_file, \
            WhitneyClient.connect(base_url, api_key) as client:

        def on_cycle(row: CycleMetrics) -> None:
            table.add(row, tokenizer)
            record = {**asdict(row), "example": tokenizer.decode(row.example),
                      "algorithm": algorithm.name}
            metrics_file.write(json.dumps(record) + "\n")
            metrics_file.flush()

        try:
            try:
                result = train(client, [tokenizer.encode(p) for p in prompt_texts], reward,
                               algorithm, config, on_cycle=on_cycle)
            finally:
                table.close()
        except CapabilityError as exc:
            say(f"whitney-grpo: refused before creating a session: {exc}")
            return 2
        except TrainingError as exc:
            say(f"whitney-grpo: {exc}")
            if isinstance(exc.__cause__, UniformRewardError) and not config.skip_uniform_groups:
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
