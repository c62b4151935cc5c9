"""The ordered loop: exact call order for two cycles, cleanup after a fault at every step,
uniform groups, capability refusal before any session, payload merging (GRAD-1)."""

from __future__ import annotations

import hashlib
import math

import pytest
from conftest import API, KEY
from test_grpo_support import Fault, label_of, tapped_client

from grpo.algorithms import Algorithm, UniformRewardError, get_algorithm
from grpo.client import TERMINAL_RUN_STATES
from grpo.errors import CapabilityError, ConflictError, ConnectionFailed, ServerError, TrainingError
from grpo.helpers import forward_backward_payload, rl_datum
from grpo.loop import LoopConfig, merge_payloads, train
from grpo.tasks import ByteTokenizer
from mock_server import Features

TOKENIZER = ByteTokenizer()
PROMPTS = [TOKENIZER.encode(word) for word in ("cat", "dog", "sun")]
SMALL = LoopConfig(cycles=2, group_size=4, prompts_per_cycle=2, max_tokens=6)


def spread_reward(tokens, prompt_tokens):
    """Distinct completions get distinct rewards, so no group is uniform."""
    return float(sum(tokens) + len(tokens))


def server_view(mock, path: str) -> dict:
    response = mock.client(KEY).get(f"{API}{path}")
    assert response.status_code == 200, response.text
    return response.json()


def test_two_cycles_call_the_primitives_in_the_seed_order(mock):
    """Seed Training loop + Checkpoints; ORD-1 seqs 1..N; VER-1 version N in cycle N."""
    client, tap = tapped_client(mock)
    result = train(client, PROMPTS, spread_reward, get_algorithm("grpo"), SMALL)
    cycle = ["save_weights_for_sampler", "sample", "sample", "forward_backward", "optim_step"]
    downloads = ["download"] * len(result.export["files"])
    assert tap.labels() == ["capabilities", "create_session", "create_run", *cycle, *cycle,
                            "save_state", "export_lora", *downloads, "finish", "close_session"]
    primitives = [c for c in tap.calls if c.path.startswith(f"{API}/runs/{result.run_id}/")
                  and c.method == "POST" and c.label not in ("finish", "cancel")]
    assert [c.body["seq"] for c in primitives] == list(range(1, 13))
    versions = [(c.label, c.body["version"]) for c in primitives if "version" in c.body]
    assert versions == [("save_weights_for_sampler", 0), ("sample", 0), ("sample", 0),
                        ("save_weights_for_sampler", 1), ("sample", 1), ("sample", 1)]
    # the server executed exactly that (ORD-5), finished the run and closed the session
    operations = [server_view(mock, f"/runs/{result.run_id}/operations/{seq}")
                  for seq in range(1, 13)]
    assert [op["primitive"] for op in operations] == [c.label for c in primitives]
    assert {op["status"] for op in operations} == {"completed"}
    assert server_view(mock, f"/runs/{result.run_id}")["state"] == "finished"
    assert server_view(mock, f"/sessions/{result.session_id}")["state"] == "closed"
    assert [row.step for row in result.metrics] == [1, 2]
    for file in result.export["files"]:
        assert hashlib.sha256(result.files[file["name"]]).hexdigest() == file["sha256"]


# label, nth call, loop phase, cycle (None = outside the cycles)
STEPS = [
    ("create_run", 1, "create_run", None),
    ("save_weights_for_sampler", 1, "save_weights_for_sampler", 0),
    ("save_weights_for_sampler", 2, "save_weights_for_sampler", 1),
    ("sample", 1, "sample", 0),
    ("sample", 4, "sample", 1),
    ("forward_backward", 1, "forward_backward", 0),
    ("forward_backward", 2, "forward_backward", 1),
    ("optim_step", 1, "optim_step", 0),
    ("optim_step", 2, "optim_step", 1),
    ("save_state", 1, "save_state", None),
    ("export_lora", 1, "export_lora", None),
    ("download", 1, "download_export", None),
    ("finish", 1, "finish", None),
    ("close_session", 1, "close_session", None),
]
KINDS = {
    "server_error": (dict(kind="respond", status=500, times=3), ServerError),
    "conflict": (dict(kind="respond", status=409, error_type="injected_conflict"),
                 ConflictError),
    "lost_connection": (dict(kind="drop_after", times=3), ConnectionFailed),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize(("label", "nth", "phase", "cycle"), STEPS)
def test_a_fault_at_any_step_leaves_the_run_terminal_and_the_session_closed(
    mock, kind, label, nth, phase, cycle
):
    """Seed Cleanup: cancel, poll until terminal, close; then TrainingError with the cycle.
    A run whose creation kept failing with its outcome unknown (lost responses, 5xx) is
    learned again with its Idempotency-Key (LIFE-9, declared by the mock) and ended too."""
    fault, error_class = KINDS[kind]
    client, tap = tapped_client(mock)
    tap.faults.append(Fault(label, nth=nth, **fault))
    with pytest.raises(TrainingError) as caught:
        train(client, PROMPTS, spread_reward, get_algorithm("grpo"), SMALL)
    error = caught.value
    assert isinstance(error.__cause__, error_class)
    assert (error.phase, error.cycle) == (phase, cycle)
    assert f"cycle {cycle}" in str(error) if cycle is not None else "outside" in str(error)
    assert error.cleanup["errors"] == []
    assert server_view(mock, f"/sessions/{error.session_id}")["state"] == "closed"
    if error.run_id is not None:
        state = server_view(mock, f"/runs/{error.run_id}")["state"]
        assert state in TERMINAL_RUN_STATES and state == error.cleanup["run_state"]
        finished = label == "close_session" or (label == "finish" and kind == "lost_connection")
        assert state == ("finished" if finished else "cancelled")
        after = tap.labels()[tap.labels().index(label) + 1:]
        assert after[-1] == "close_session" and ("cancel" in after)


def without_idempotent_create(make_mock):
    """A server of contract 1.0 for creations: no ``features.idempotent_create``."""
    return make_mock(features=Features(idempotent_create=False))


def test_a_fault_creating_the_session_leaves_nothing_to_clean(make_mock):
    """Without LIFE-9 a creation has no replay protection: a 5xx is not retried."""
    mock = without_idempotent_create(make_mock)
    client, tap = tapped_client(mock)
    tap.faults.append(Fault("create_session", status=503))
    with pytest.raises(TrainingError) as caught:
        train(client, PROMPTS, spread_reward, get_algorithm("grpo"), SMALL)
    assert isinstance(caught.value.__cause__, ServerError)
    assert caught.value.session_id is None and caught.value.run_id is None
    assert tap.labels() == ["capabilities", "create_session"]  # no seq: not retried, no cleanup


def test_a_run_whose_creation_response_was_lost_is_reported_not_hidden(make_mock):
    """Without LIFE-9 (the documented limitation): ``POST .../runs`` is not retried after a
    lost response; the run the server did create is unknown to the client, close answers 409
    ``runs_not_terminal`` (LIFE-3), and the error says so instead of pretending the session
    closed."""
    mock = without_idempotent_create(make_mock)
    client, tap = tapped_client(mock)
    tap.faults.append(Fault("create_run", kind="drop_after"))
    with pytest.raises(TrainingError) as caught:
        train(client, PROMPTS, spread_reward, get_algorithm("grpo"), SMALL)
    error = caught.value
    assert isinstance(error.__cause__, ConnectionFailed) and error.run_id is None
    assert error.cleanup["session_state"] is None
    assert "runs_not_terminal" in error.cleanup["errors"][0]
    assert server_view(mock, f"/sessions/{error.session_id}")["state"] == "open"
    assert [c.label for c in tap.calls].count("create_run") == 1


@pytest.mark.parametrize("label,fault", [
    ("create_session", dict(kind="drop_after")),
    ("create_run", dict(kind="drop_after")),
    ("create_session", dict(kind="respond", status=503)),
    ("create_run", dict(kind="drop_after", times=2)),
    ("create_run", dict(kind="throttle", retry_after="2")),
])
def test_with_idempotent_create_a_lost_creation_is_retried_and_nothing_leaks(mock, label, fault):
    """LIFE-9: every creation carries one Idempotency-Key on all its attempts; a lost response
    or a 5xx is retried like a primitive and comes back as the first answer (replayed), so the
    loop trains on exactly one session with one run and nothing is left behind."""
    client, tap = tapped_client(mock)
    tap.faults.append(Fault(label, **fault))
    result = train(client, PROMPTS, spread_reward, get_algorithm("grpo"), SMALL)
    attempts = [c for c in tap.calls if c.label == label]
    assert len(attempts) == 1 + fault.get("times", 1)
    backend = mock.backend
    assert list(backend.sessions) == [result.session_id]
    assert backend.sessions[result.session_id].run_ids == [result.run_id]
    assert server_view(mock, f"/sessions/{result.session_id}")["state"] == "closed"
    assert server_view(mock, f"/runs/{result.run_id}")["state"] == "finished"


def test_the_idempotency_key_is_one_per_creation_and_the_same_on_retries(mock):
    client, tap = tapped_client(mock)
    seen: list[tuple[str, str]] = []
    original = tap.inner.handle_request

    def record(request):
        if request.method == "POST" and label_of(request.method, request.url.path) in (
                "create_session", "create_run"):
            seen.append((label_of(request.method, request.url.path),
                         request.headers["idempotency-key"]))
        return original(request)

    tap.inner.handle_request = record  # type: ignore[method-assign]
    tap.faults.append(Fault("create_run", kind="drop_after"))
    train(client, PROMPTS, spread_reward, get_algorithm("grpo"), SMALL)
    train(client, PROMPTS, spread_reward, get_algorithm("grpo"), SMALL)
    labels = [label for label, _ in seen]
    assert labels == ["create_session", "create_run", "create_run"] + [
        "create_session", "create_run"]
    keys = [key for _, key in seen]
    assert keys[1] == keys[2]  # the retry of the lost creation
    assert len({keys[0], keys[1], keys[3], keys[4]}) == 4  # one per logical creation


def test_uniform_group_stops_the_run_with_the_seeds_error(mock):
    client, tap = tapped_client(mock)
    with pytest.raises(TrainingError) as caught:
        train(client, PROMPTS, lambda tokens, prompt: 1.0, get_algorithm("grpo"), SMALL)
    error = caught.value
    assert (error.phase, error.cycle) == ("build_loss", 0)
    assert isinstance(error.__cause__, UniformRewardError)
    assert isinstance(error.__cause__, ValueError)
    assert str(error.__cause__) == "cycle 0: reward is uniform across the group, no gradient signal"
    assert "forward_backward" not in tap.labels()
    assert server_view(mock, f"/runs/{error.run_id}")["state"] == "cancelled"
    assert server_view(mock, f"/sessions/{error.session_id}")["state"] == "closed"


def uniform_for_dog(tokens, prompt_tokens):
    return 0.5 if TOKENIZER.decode(prompt_tokens) == "dog" else spread_reward(tokens, None)


def test_skipping_uniform_groups_is_opt_in_and_counted(mock):
    client, tap = tapped_client(mock)
    with pytest.raises(TrainingError):  # default: stop
        train(client, PROMPTS, uniform_for_dog, get_algorithm("rloo"), SMALL)
    config = LoopConfig(cycles=2, group_size=4, prompts_per_cycle=2, max_tokens=6,
                        skip_uniform_groups=True)
    client, tap = tapped_client(mock)
    result = train(client, PROMPTS, uniform_for_dog, get_algorithm("rloo"), config)
    # cycle 0 samples cat, dog; cycle 1 samples sun, cat (prompts rotate)
    assert [row.groups_skipped for row in result.metrics] == [1, 0]
    assert [row.groups for row in result.metrics] == [2, 2]
    sizes = [len(c.body["data"]) for c in tap.calls if c.label == "forward_backward"]
    assert sizes == [4, 8]


def test_a_cycle_with_only_uniform_groups_still_stops_when_skipping(mock):
    client, _ = tapped_client(mock)
    config = LoopConfig(cycles=2, group_size=4, prompts_per_cycle=2, max_tokens=6,
                        skip_uniform_groups=True)
    with pytest.raises(TrainingError) as caught:
        train(client, PROMPTS, lambda tokens, prompt: 0.0, get_algorithm("grpo"), config)
    assert isinstance(caught.value.__cause__, UniformRewardError)
    assert "every group" in str(caught.value.__cause__)


def drop_loss(name):
    def rewrite(capabilities):
        capabilities["loss_functions"].pop(name)
        return capabilities
    return rewrite


@pytest.mark.parametrize(("algorithm", "rewrite", "reason"), [
    ("ppo", drop_loss("ppo"), "'ppo' is not offered"),
    ("dro", drop_loss("dro"), "'dro' is not offered"),
    ("grpo", lambda c: {**c, "primitives": [p for p in c["primitives"] if p != "export_lora"]},
     "export_lora"),
    ("cispo", lambda c: (c["loss_functions"]["cispo"]["config"]["clip_high_threshold"]
                         .update(max=1.1), c)[1], "outside"),
    ("grpo", lambda c: (c["loss_functions"]["importance_sampling"]["inputs"]
                        .update(optional=[]), c)[1], r"does not declare inputs \['mask'\]"),
    ("rloo", lambda c: (c["limits"].update(max_num_samples=2), c)[1], "max_num_samples"),
])
def test_missing_capability_stops_before_any_session(mock, algorithm, rewrite, reason):
    """DISC-2: never silently substitute generic GRPO; nothing is created."""
    client, tap = tapped_client(mock)
    tap.rewrite["capabilities"] = rewrite
    with pytest.raises(CapabilityError, match=reason):
        train(client, PROMPTS, spread_reward, get_algorithm(algorithm), SMALL)
    assert tap.labels() == ["capabilities"]


def test_kl_penalty_needs_the_logprobs_primitive(mock):
    client, tap = tapped_client(mock)
    tap.rewrite["capabilities"] = lambda c: {
        **c, "primitives": [p for p in c["primitives"] if p != "logprobs"]}
    with pytest.raises(CapabilityError, match="logprobs"):
        train(client, PROMPTS, spread_reward, get_algorithm("grpo", kl_coef=0.1), SMALL)
    assert tap.labels() == ["capabilities"]


def test_a_payload_with_another_loss_than_declared_is_refused(mock):
    def sneaky(sample, cycle, request, ctx):
        payload = get_algorithm("grpo").build_loss(sample, cycle, request, ctx)
        return {**payload, "loss_function": "ppo"}

    client, tap = tapped_client(mock)
    algorithm = Algorithm("sneaky", sneaky, "importance_sampling")
    with pytest.raises(TrainingError, match="declared importance_sampling"):
        train(client, PROMPTS, spread_reward, algorithm, SMALL)
    assert "forward_backward" not in tap.labels()


def test_interrupt_is_cleaned_up_and_re_raised_unwrapped(mock):
    def interrupting(tokens, prompt_tokens):
        raise KeyboardInterrupt

    client, tap = tapped_client(mock)
    with pytest.raises(KeyboardInterrupt):
        train(client, PROMPTS, interrupting, get_algorithm("grpo"), SMALL)
    assert tap.labels()[-1] == "close_session" and "cancel" in tap.labels()


def test_merged_forward_backward_equals_one_request_per_chunk(make_mock):
    """GRAD-1: splitting the cycle's data into requests of 3 datums gives the same gradient
    (grad norm) as one request, cycle after cycle."""
    config = LoopConfig(cycles=3, group_size=4, prompts_per_cycle=3, max_tokens=6)
    merged_client, merged_tap = tapped_client(make_mock())
    merged = train(merged_client, PROMPTS, spread_reward, get_algorithm("grpo"), config)
    split_client, split_tap = tapped_client(make_mock())
    split_tap.rewrite["capabilities"] = lambda c: (c["limits"].update(
        max_datums_per_request=3), c)[1]
    split = train(split_client, PROMPTS, spread_reward, get_algorithm("grpo"), config)
    assert merged_tap.labels().count("forward_backward") == 3
    assert split_tap.labels().count("forward_backward") == 3 * 4  # 12 datums / 3
    for a, b in zip(merged.metrics, split.metrics, strict=False):
        assert math.isclose(a.grad_norm, b.grad_norm, rel_tol=1e-9)
        assert math.isclose(a.loss, b.loss, rel_tol=1e-9, abs_tol=1e-9)


def test_merge_payloads_respects_limits_and_never_mixes_losses():
    def payload(n, loss="ppo", config=None, length=3):
        datum = rl_datum([256] * (length - 1), [1, 2], [-1.0, -1.0], 1.0)
        return forward_backward_payload([datum] * n, loss, config)

    chunks = merge_payloads([payload(2), payload(3)], {"max_datums_per_request": 4})
    assert [len(c["data"]) for c in chunks] == [4, 1]
    mixed = merge_payloads([payload(1), payload(1, config={"clip_low_threshold": 0.5}),
                            payload(1, loss="cispo")], {})
    assert [(c["loss_function"], c["loss_config"]) for c in mixed] == [
        ("ppo", {}), ("ppo", {"clip_low_threshold": 0.5}), ("cispo", {})]
    by_tokens = merge_payloads([payload(3, length=5)], {"max_tokens_per_request": 12})
    assert [len(c["data"]) for c in by_tokens] == [2, 1]  # 6 positions per datum


def test_loop_config_refuses_a_loop_the_seed_would_not_run():
    with pytest.raises(ValueError, match="two cycles"):
        LoopConfig(cycles=1)
    with pytest.raises(ValueError, match="baseline"):
        LoopConfig(group_size=1)
    with pytest.raises(ValueError):
        LoopConfig(updates_per_cycle=0)


def test_a_fault_at_logprobs_in_the_kl_variant_is_cleaned_up_too(mock):
    client, tap = tapped_client(mock)
    tap.faults.append(Fault("logprobs", nth=5, status=500, times=3))
    with pytest.raises(TrainingError) as caught:
        train(client, PROMPTS, spread_reward, get_algorithm("grpo", kl_coef=0.1), SMALL)
    assert (caught.value.phase, caught.value.cycle) == ("build_loss", 0)
    assert isinstance(caught.value.__cause__, ServerError)
    assert server_view(mock, f"/runs/{caught.value.run_id}")["state"] == "cancelled"
    assert server_view(mock, f"/sessions/{caught.value.session_id}")["state"] == "closed"


def test_polling_for_a_terminal_state_is_bounded(mock):
    """A run that never reads terminal (here: every view rewritten to ``cancelling``) does not
    hang the cleanup: it stops after ``cancel_timeout_seconds`` and reports what it saw."""
    client, tap = tapped_client(mock)
    tap.faults.append(Fault("optim_step", status=500, times=3))
    tap.rewrite["get_run"] = lambda view: {**view, "state": "cancelling"}
    config = LoopConfig(cycles=2, group_size=4, prompts_per_cycle=2, max_tokens=6,
                        cancel_timeout_seconds=0.2)
    with pytest.raises(TrainingError) as caught:
        train(client, PROMPTS, spread_reward, get_algorithm("grpo"), config)
    assert caught.value.cleanup["run_state"] == "cancelling"
    assert tap.labels().count("get_run") >= 1
    assert server_view(mock, f"/runs/{caught.value.run_id}")["state"] == "cancelled"
