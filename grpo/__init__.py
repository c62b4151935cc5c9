"""whitney-kit's reference GRPO client loop for the Whitney JSON primitive contract.

Public surface (the seed's names where the seed has one)::

    WhitneyClient, RunHandle, RetryPolicy              grpo.client      HTTP, seq, retries
    AdamW, DEFAULT_ADAMW, LoopConfig                   grpo.config      what the loop sends
    group_mean_advantages, all_zero, rl_datum,
    forward_backward_payload, leave_one_out_advantages grpo.helpers     caller-owned math
    Algorithm, ALGORITHMS, get_algorithm, LossContext,
    UniformRewardError, with_kl_penalty                grpo.algorithms  build_loss variants
    CycleMetrics, TrainResult, train,
    cancel_and_close                                   grpo.loop        the ordered loop
    Task, TASKS, get_task                              grpo.tasks       toy byte tasks
    Tokenizer, ByteTokenizer, HFTokenizer,
    load_tokenizer                                     grpo.tokenizers  text <-> ids
    UserReward, load_reward                            grpo.rewards     the caller's reward
    WhitneyClientError, APIError, CapabilityError,
    RewardError, TrainingError (and the others)        grpo.errors

``Run`` and ``WhitneyError`` are the former names of ``RunHandle`` and ``WhitneyClientError``
(kept as aliases; ``mock_server`` uses both names for other things: a run's server-side record
and its domain error).
"""

from grpo.algorithms import (
    ALGORITHMS,
    Algorithm,
    LossContext,
    UniformRewardError,
    get_algorithm,
    with_kl_penalty,
)
from grpo.client import RetryPolicy, Run, RunHandle, WhitneyClient
from grpo.config import DEFAULT_ADAMW, AdamW, LoopConfig
from grpo.errors import (
    APIError,
    AuthenticationError,
    BadRequestError,
    CapabilityError,
    ConflictError,
    ConnectionFailed,
    IntegrityError,
    NotFoundError,
    PayloadTooLargeError,
    ProtocolError,
    RateLimitError,
    RewardError,
    ServerError,
    TrainingError,
    ValidationError,
    WhitneyClientError,
    WhitneyError,
)
from grpo.helpers import (
    all_zero,
    forward_backward_payload,
    group_mean_advantages,
    leave_one_out_advantages,
    rl_datum,
)
from grpo.loop import CycleMetrics, TrainResult, cancel_and_close, train
from grpo.rewards import UserReward, load_reward
from grpo.tasks import TASKS, Task, get_task
from grpo.tokenizers import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer

__all__ = [
    "ALGORITHMS", "APIError", "AdamW", "Algorithm", "AuthenticationError", "BadRequestError",
    "ByteTokenizer", "CapabilityError", "ConflictError", "ConnectionFailed", "CycleMetrics",
    "DEFAULT_ADAMW", "HFTokenizer", "IntegrityError", "LoopConfig", "LossContext",
    "NotFoundError", "PayloadTooLargeError", "ProtocolError", "RateLimitError", "RetryPolicy",
    "RewardError", "Run", "RunHandle", "ServerError", "TASKS", "Task", "Tokenizer",
    "TrainResult", "TrainingError", "UniformRewardError", "UserReward", "ValidationError",
    "WhitneyClient", "WhitneyClientError", "WhitneyError", "all_zero", "cancel_and_close",
    "forward_backward_payload", "get_algorithm", "get_task", "group_mean_advantages",
    "leave_one_out_advantages", "load_reward", "load_tokenizer", "rl_datum", "train",
    "with_kl_penalty",
]
