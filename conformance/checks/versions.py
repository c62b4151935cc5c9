"""VER-1..4 (versions, immutable snapshots, sampler logprobs, determinism) and SAMPLE-1."""

from __future__ import annotations

from typing import Any

from ..context import Ctx, RunHandle, assert_close
from ..registry import CheckFailed, CheckWarning, check


def _sample(run: RunHandle, version: int, prompt: list[int], n: int = 2,
            **params: Any) -> dict[str, Any]:
    """``sample`` within the server's limits (``Ctx.sample_body``)."""
    return run.body("sample", run.ctx.sample_body(version, prompt, n, **params))


def _logprobs(run: RunHandle, version: int, token_ids: list[int]) -> dict[str, Any]:
    return run.body("logprobs", {"version": version, "token_ids": token_ids})


def _train(ctx: Ctx, run: RunHandle, text: str) -> None:
    run.train(ctx.tokens(text), learning_rate=0.05)


def _names(ctx: Ctx, reply: dict[str, Any], version: int, step: int, what: str) -> None:
    if reply.get("version") != version or reply.get("step") != step:
        raise CheckFailed(f"{what} names version {reply.get('version')!r} step "
                          f"{reply.get('step')!r}; it was saved as version {version} at step "
                          f"{step}")


def _needs_versions(ctx: Ctx, count: int) -> None:
    """The check keeps ``count`` versions of one run at once (within max_versions_per_run)."""
    limit = ctx.limit("max_versions_per_run")
    if limit < count:
        raise CheckWarning(f"not exercised: the check keeps {count} versions of a run "
                           f"(limits.max_versions_per_run is {limit})")


@check("VER-1", "increasing", title="save_weights_for_sampler versions strictly increase (gaps "
       "allowed), else 409 version_conflict; over max_versions_per_run 409 quota_exceeded")
def ver1_increasing(ctx: Ctx) -> None:
    _needs_versions(ctx, 2)
    run = ctx.run()
    _names(ctx, run.save(0), 0, 0, "save_weights_for_sampler(0)")
    _train(ctx, run, "versions")
    _names(ctx, run.save(5), 5, 1, "save_weights_for_sampler(5)")
    for stale in (5, 3):
        run.prim("save_weights_for_sampler", {"version": stale},
                 expect=(409, "version_conflict"))
    view = run.get()
    if [(v["version"], v["step"]) for v in view["versions"]] != [(0, 0), (5, 1)]:
        raise CheckFailed(f"run versions {view['versions']}, expected versions 0 (step 0) and "
                          f"5 (step 1)")
    limit = ctx.quota("max_versions_per_run")
    version = 6
    while len(run.get()["versions"]) < limit:
        run.save(version)
        version += 1
    run.prim("save_weights_for_sampler", {"version": version},
             expect=(409, "quota_exceeded"))


@check("VER-2", "immutable-versions", title="sample and logprobs at version N use the weights "
       "saved as N whatever training followed, name version and step, and never change the "
       "training weights")
def ver2_immutable(ctx: Ctx) -> None:
    if not ctx.has_primitive("logprobs") and not ctx.declares("features.deterministic_sampling"):
        raise CheckWarning("not exercised: neither logprobs nor deterministic_sampling declared")
    _needs_versions(ctx, 2)
    run = ctx.run()
    prompt = ctx.tokens("Hi")
    scored = ctx.tokens("Hi there")

    _names(ctx, run.save(0), 0, 0, "save_weights_for_sampler(0)")
    before = run.score(scored)
    sample0 = _sample(run, 0, prompt, seed=11)
    _names(ctx, sample0, 0, 0, "sample at version 0")
    lp0 = None
    if ctx.has_primitive("logprobs"):
        lp0 = _logprobs(run, 0, scored)
        _names(ctx, lp0, 0, 0, "logprobs at version 0")
    after = run.score(scored)
    assert_close(after, before, ctx.tol, "training-weight logprobs after sample/logprobs")
    _train(ctx, run, "shift the weights")
    _names(ctx, run.save(1), 1, 1, "save_weights_for_sampler(1)")
    _train(ctx, run, "and again")
    if lp0 is not None:
        again = _logprobs(run, 0, scored)
        _names(ctx, again, 0, 0, "logprobs at version 0 after training")
        assert_close(again["logprobs"], lp0["logprobs"], ctx.tol,
                     "version 0 logprobs after two optimizer steps")
        lp1 = _logprobs(run, 1, scored)
        _names(ctx, lp1, 1, 1, "logprobs at version 1")
        moved = max(abs(a - b)
                    for a, b in zip(lp1["logprobs"][1:], lp0["logprobs"][1:], strict=False))
        if moved <= 10 * ctx.tol:
            raise CheckFailed(f"version 1 scores like version 0 (max diff {moved:g}): training "
                              f"did not reach the saved version")
    sample1 = _sample(run, 1, prompt, seed=11)
    _names(ctx, sample1, 1, 1, "sample at version 1")
    if ctx.declares("features.deterministic_sampling"):
        replay0 = _sample(run, 0, prompt, seed=11)
        _names(ctx, replay0, 0, 0, "sample at version 0 after training")
        if [s["tokens"] for s in replay0["sequences"]] != \
                [s["tokens"] for s in sample0["sequences"]]:
            again = _sample(run, 0, prompt, seed=11)
            if [s["tokens"] for s in again["sequences"]] != \
                    [s["tokens"] for s in replay0["sequences"]]:
                raise CheckWarning("inconclusive: the same seed gives different tokens on one "
                                   "version (a VER-4 failure), so samples cannot show which "
                                   "weights a version uses")
            raise CheckFailed("sample at version 0 with the same seed changed after training")


@check("VER-3", "sampler-logprobs", title="sequences[].logprobs are temperature-1 policy "
       "logprobs of the sampled tokens: equal to logprobs and to forward right after the save")
def ver3_sampler_logprobs(ctx: Ctx) -> None:
    run = ctx.run()
    _train(ctx, run, "make the adapter non-trivial")
    run.save(0)
    prompt = ctx.tokens("The ")
    settings = [dict(temperature=0.7, top_k=ctx.top_k(0.08), top_p=0.9, seed=3),
                dict(temperature=1.6, top_k=0, top_p=1.0, seed=4),
                dict(temperature=1.0, top_k=0, top_p=0.5, seed=5)]
    for params in settings:
        result = _sample(run, 0, prompt, n=2, max_tokens=5, stop_token_ids=[], **params)
        for i, seq in enumerate(result["sequences"]):
            tokens, lps = seq["tokens"], seq["logprobs"]
            if not tokens:
                continue
            what = f"sample({params}) sequence {i}"
            full = prompt + tokens
            fwd = run.score(full)
            assert_close(lps, fwd[len(prompt) - 1:], ctx.tol,
                         f"{what}: sampler logprobs vs forward")
            if ctx.has_primitive("logprobs"):
                scored = _logprobs(run, 0, full)["logprobs"]
                assert_close(lps, scored[len(prompt):], ctx.tol,
                             f"{what}: sampler logprobs vs logprobs primitive")


@check("VER-4", "deterministic", capability="features.deterministic_sampling",
       title="same version, prompt, params and seed: same tokens")
def ver4_deterministic(ctx: Ctx) -> None:
    run = ctx.run()
    run.save(0)
    prompt = ctx.tokens("Once")
    params = dict(max_tokens=6, temperature=1.3, top_k=ctx.top_k(0.2), top_p=0.95, seed=1234)
    first = _sample(run, 0, prompt, n=3, **params)
    second = _sample(run, 0, prompt, n=3, **params)
    if [s["tokens"] for s in first["sequences"]] != [s["tokens"] for s in second["sequences"]]:
        raise CheckFailed(f"same seed, different tokens: {first['sequences']} vs "
                          f"{second['sequences']}")
    assert_close([x for s in second["sequences"] for x in s["logprobs"]],
                 [x for s in first["sequences"] for x in s["logprobs"]], ctx.tol,
                 "logprobs of the repeated sample")


def _stop_problems(result: dict[str, Any], n: int, max_tokens: int, stops: set[int]) -> list[str]:
    problems = []
    sequences = result.get("sequences") or []
    if len(sequences) != n:
        problems.append(f"{len(sequences)} sequences for num_samples {n}")
    for i, seq in enumerate(sequences):
        tokens, lps, reason = seq.get("tokens"), seq.get("logprobs"), seq.get("stop_reason")
        if not isinstance(tokens, list) or not isinstance(lps, list) or len(tokens) != len(lps):
            problems.append(f"sequence {i}: len(logprobs) != len(tokens)")
            continue
        early = [t for t in tokens[:-1] if t in stops]
        if early:
            problems.append(f"sequence {i} continues past stop token {early[0]}: {tokens}")
        if reason == "stop":
            if not tokens or tokens[-1] not in stops:
                problems.append(f"sequence {i} says stop but ends with {tokens[-1:]} "
                                f"(the stop token must be included)")
        elif reason == "length":
            if len(tokens) != max_tokens or (tokens and tokens[-1] in stops):
                problems.append(f"sequence {i} says length with {len(tokens)} tokens "
                                f"(max_tokens {max_tokens}): {tokens}")
        else:
            problems.append(f"sequence {i} stop_reason {reason!r}")
    return problems


@check("SAMPLE-1", "stop", title="a sequence ends at the first stop token (included, 'stop') "
       "or after max_tokens ('length'); [] means no stop; default is [eos]")
def sample1_stop(ctx: Ctx) -> None:
    run = ctx.run()
    run.save(0)
    prompt = ctx.tokens("ab")
    n, m = ctx.num_samples(6), ctx.sampling(prompt, max_tokens=5)["max_tokens"]
    free = _sample(run, 0, prompt, n=n, max_tokens=m, seed=22, stop_token_ids=[])
    problems = [f"stop_token_ids []: {p}" for p in _stop_problems(free, n, m, set())]
    if any(s["stop_reason"] != "length" for s in free["sequences"]):
        problems.append("stop_token_ids [] produced a 'stop' sequence")
    # Stop tokens seen early in half of the free sequences make both endings likely.
    half = (n + 1) // 2
    stops = {s["tokens"][1] for s in free["sequences"][:half] if len(s["tokens"]) > 1}
    stops -= {t for s in free["sequences"][half:] for t in s["tokens"][:2]}
    stops = stops or {free["sequences"][0]["tokens"][0]}
    result = _sample(run, 0, prompt, n=n, max_tokens=m, seed=22, stop_token_ids=sorted(stops))
    problems += _stop_problems(result, n, m, stops)
    reasons = {s["stop_reason"] for s in result["sequences"]}
    n, m = ctx.num_samples(4), ctx.sampling(prompt, max_tokens=6)["max_tokens"]
    default = _sample(run, 0, prompt, n=n, max_tokens=m, seed=23)
    problems += [f"default stops: {p}" for p in _stop_problems(default, n, m, {ctx.eos})]
    if problems:
        raise CheckFailed("; ".join(problems[:6]))
    if reasons != {"stop", "length"}:
        raise CheckWarning(f"only stop_reason {sorted(reasons)} occurred with stop tokens "
                           f"{sorted(stops)}; the other branch was not exercised")
