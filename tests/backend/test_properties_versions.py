"""Version sync (VER-1..4) over HTTP for random training histories.

A history is a random list of training steps (forward_backward of random datums under a random
loss, optim_step with random AdamW settings), gradient accumulation without a step, version
saves with random gaps (VER-1), checkpoints and restores (CKPT-1), and queries of earlier
versions. At every save the test captures a copy of the run's weights from the backend; every
``sample`` and ``logprobs`` at that version, however much training followed, must equal a
recomputation with ``mock_server.engine.model`` from that copy (VER-2: tokens bit for bit with the
same seed, logprobs within ``features.logprob_tolerance``), name the version and the step it was
saved at, and leave the training weights untouched. Right after each save the sampler's
logprobs must equal ``logprobs`` on the version and ``forward`` on the live weights (VER-3),
whatever temperature, top-k and top-p sampled them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import ADAMW, API, BOS, EOS, MODEL, expect_error, module_mock
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from mock_server.engine.model import get_base_model
from mock_server.engine.specs import Lora

BASE = get_base_model(MODEL)
TOKENS = st.integers(0, 255) | st.sampled_from([BOS, EOS])
TEXT = st.lists(st.sampled_from(list(b"abcdehlorst ")), min_size=1, max_size=6)


@pytest.fixture(scope="module")
def mock() -> Iterator[tuple[httpx.Client, Any]]:
    """One mock for the module (each example opens and closes its own session)."""
    yield from module_mock()


# -- histories ------------------------------------------------------------------------------
@st.composite
def datum(draw: Any, loss: str) -> dict[str, Any]:
    tokens = [BOS] + draw(TEXT) + draw(st.lists(TOKENS, max_size=3))
    n = len(tokens) - 1
    floats = lambda lo, hi: st.lists(st.floats(lo, hi), min_size=n, max_size=n)  # noqa: E731
    inputs: dict[str, Any] = {"target_tokens": tokens[1:]}
    if loss == "cross_entropy":
        inputs["weights"] = draw(floats(0.0, 2.0))
    else:
        inputs["logprobs"] = draw(floats(-6.0, -0.5))
        inputs["advantages"] = draw(floats(-2.0, 2.0))
    return {"model_input": {"token_ids": tokens[:-1]}, "loss_inputs": inputs}


@st.composite
def forward_backward(draw: Any) -> dict[str, Any]:
    loss = draw(st.sampled_from(["cross_entropy", "importance_sampling", "ppo", "dro"]))
    return {"loss_function": loss, "loss_config": {},
            "data": draw(st.lists(datum(loss), min_size=1, max_size=2))}


ADAMW_ST = st.builds(lambda lr, wd, clip: {**ADAMW, "learning_rate": lr, "weight_decay": wd,
                                           "grad_clip_norm": clip},
                     st.floats(1e-3, 0.05), st.sampled_from([0.0, 0.01]),
                     st.sampled_from([0.0, 1.0]))
SAMPLING = st.fixed_dictionaries({
    "max_tokens": st.integers(1, 6), "temperature": st.sampled_from([0.5, 1.0, 1.7]),
    "top_k": st.sampled_from([0, 1, 8]), "top_p": st.sampled_from([1.0, 0.8]),
    "seed": st.integers(0, 2**31)})
QUERY = st.fixed_dictionaries({"prompt": st.lists(TOKENS, min_size=1, max_size=4).map(
    lambda t: [BOS] + t), "sampling": SAMPLING, "num_samples": st.integers(1, 3),
    "token_ids": st.lists(TOKENS, min_size=2, max_size=8)})
STEP = st.one_of(
    st.tuples(st.just("train"), forward_backward(), ADAMW_ST),
    st.tuples(st.just("accumulate"), forward_backward()),
    st.tuples(st.just("save"), st.integers(1, 3), QUERY),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("restore"), st.booleans()),
    st.tuples(st.just("query"), st.integers(0, 10**6), QUERY),
)
HISTORY = st.lists(STEP, min_size=1, max_size=10).map(
    lambda steps: [("save", 1, None), *steps, ("save", 1, None)])  # at least two versions


# -- the run under test -----------------------------------------------------------------------
@dataclass
class Saved:
    step: int
    lora: Lora
    first_sample: tuple[dict[str, Any], dict[str, Any]] | None = None  # (request, response)


class Trainer:
    """A session + run over HTTP with its own seq counter, and what the test saw saved."""

    def __init__(self, http: httpx.Client, backend: Any) -> None:
        self.http, self.backend = http, backend
        self.session = http.post(f"{API}/sessions", json={}).json()["session_id"]
        self.run = http.post(f"{API}/sessions/{self.session}/runs", json={
            "base_model": MODEL, "lora": {"rank": 4, "alpha": 8.0, "seed": 11},
            "optimizer": "adamw"}).json()["run_id"]
        self.seq, self.step, self.version = 0, 0, -1
        self.saved: dict[int, Saved] = {}
        self.checkpoint: tuple[str, int] | None = None
        self.tolerance = http.get(f"{API}/capabilities").json()["features"]["logprob_tolerance"]

    def post(self, primitive: str, body: dict[str, Any]) -> Any:
        self.seq += 1
        response = self.http.post(f"{API}/runs/{self.run}/{primitive}",
                                  json={"seq": self.seq, **body})
        assert response.status_code == 200, response.text
        return response.json()

    def weights(self) -> dict[str, np.ndarray]:
        return {k: a.copy() for k, a in self.backend.runs[self.run].lora.params.items()}

    def close(self) -> None:
        self.http.post(f"{API}/runs/{self.run}/finish", json={})
        assert self.http.post(f"{API}/sessions/{self.session}/close", json={}).status_code == 200

    # -- steps ----------------------------------------------------------------------------
    def apply(self, step: tuple[Any, ...]) -> None:
        kind = step[0]
        if kind == "train":
            self.post("forward_backward", step[1])
            assert self.post("optim_step", {"adamw": step[2]})["step"] == self.step + 1
            self.step += 1
        elif kind == "accumulate":
            self.post("forward_backward", step[1])
        elif kind == "save":
            self.save(self.version + step[1], step[2])
        elif kind == "checkpoint":
            self.checkpoint = (self.post("save_state", {"name": "c"})["checkpoint_id"], self.step)
        elif kind == "restore" and self.checkpoint is not None:
            checkpoint_id, step_then = self.checkpoint
            assert self.post("load_state", {"checkpoint_id": checkpoint_id,
                                            "with_optimizer": step[1]})["step"] == step_then
            self.step = step_then
        elif kind == "query" and self.saved:
            versions = sorted(self.saved)
            self.check_version(versions[step[1] % len(versions)], step[2])

    def save(self, version: int, query: dict[str, Any] | None) -> None:
        """Save ``version`` (VER-1), capture its weights, and check VER-3 right away."""
        assert self.post("save_weights_for_sampler", {"version": version}) == \
            {"version": version, "step": self.step}
        self.version = version
        self.saved[version] = Saved(self.step, self.backend.runs[self.run].lora.copy())
        query = query or {"prompt": [BOS, 104], "num_samples": 2, "token_ids": [BOS, 104, 105],
                          "sampling": {"max_tokens": 4, "temperature": 1.0, "top_k": 0,
                                       "top_p": 1.0, "seed": 5}}
        request, response = self.check_version(version, query)
        self.saved[version].first_sample = (request, response)
        data = [{"model_input": {"token_ids": (request["prompt"]["token_ids"] + s["tokens"])[:-1]},
                 "loss_inputs": {"target_tokens": (request["prompt"]["token_ids"]
                                                   + s["tokens"])[1:]}}
                for s in response["sequences"]]
        outputs = self.post("forward", {"loss_function": "cross_entropy", "loss_config": {},
                                        "data": data})["outputs"]
        start = len(request["prompt"]["token_ids"]) - 1
        for sequence, output in zip(response["sequences"], outputs, strict=False):  # VER-3: forward
            np.testing.assert_allclose(output["logprobs"][start:], sequence["logprobs"],
                                       rtol=0, atol=self.tolerance)

    def check_version(self, version: int, query: dict[str, Any]
                      ) -> tuple[dict[str, Any], dict[str, Any]]:
        """VER-2/VER-3/VER-4 at ``version``: sample and logprobs against the captured copy."""
        saved, before = self.saved[version], self.weights()
        prompt, sampling = query["prompt"], query["sampling"]
        request = {"version": version, "prompt": {"token_ids": prompt},
                   "num_samples": query["num_samples"], "sampling": sampling}
        response = self.post("sample", request)
        assert (response["version"], response["step"]) == (version, saved.step)
        expected = BASE.sample(saved.lora, np.array(prompt), num_samples=query["num_samples"],
                               max_tokens=sampling["max_tokens"],
                               temperature=sampling["temperature"], top_k=sampling["top_k"],
                               top_p=sampling["top_p"], seed=sampling["seed"],
                               stop_token_ids=[EOS])
        assert [s["tokens"] for s in response["sequences"]] == [e.tokens.tolist()
                                                               for e in expected]
        for sequence in response["sequences"]:
            full = prompt + sequence["tokens"]
            scored = self.post("logprobs", {"version": version, "token_ids": full})
            assert (scored["version"], scored["step"]) == (version, saved.step)
            recomputed = BASE.score(saved.lora, np.array(full))[len(prompt):]
            np.testing.assert_allclose(sequence["logprobs"], recomputed, rtol=0,
                                       atol=self.tolerance)
            np.testing.assert_allclose(scored["logprobs"][len(prompt):], sequence["logprobs"],
                                       rtol=0, atol=self.tolerance)  # VER-3: logprobs
        scored = self.post("logprobs", {"version": version, "token_ids": query["token_ids"]})
        assert scored["logprobs"][0] is None
        np.testing.assert_allclose(scored["logprobs"][1:],
                                   BASE.score(saved.lora, np.array(query["token_ids"]))[1:],
                                   rtol=0, atol=self.tolerance)
        after = self.weights()  # VER-2: sampling and scoring never touch the training weights
        assert all(np.array_equal(before[k], after[k]) for k in before)
        return request, response


@settings(max_examples=examples(25, 400))
@given(history=HISTORY)
def test_ver_2_every_saved_version_is_served_from_its_own_weights(mock, history):
    """VER-1..4 for a random history; at the end every version is checked again, and sampling
    it with the first request's seed gives the first response back (VER-2, VER-4)."""
    http, backend = mock
    trainer = Trainer(http, backend)
    try:
        for step in history:
            trainer.apply(step)
        versions = sorted(trainer.saved)
        view = http.get(f"{API}/runs/{trainer.run}").json()
        assert [(v["version"], v["step"]) for v in view["versions"]] == \
            [(v, trainer.saved[v].step) for v in versions]  # VER-1: increasing, with gaps
        for version in versions:
            request, first = trainer.saved[version].first_sample
            assert trainer.post("sample", request) == first
        last = versions[-1]
        trainer.seq += 1
        expect_error(http.post(f"{API}/runs/{trainer.run}/save_weights_for_sampler",
                               json={"seq": trainer.seq, "version": last}),
                     409, "version_conflict")
    finally:
        trainer.close()
