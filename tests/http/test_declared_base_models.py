"""Declared base models (issue 13): the same declaration everywhere (``create_app``,
``python -m mock_server`` flags and environment, ``MockWhitney``), capabilities list exactly
the declared models, runs work on them, and a bad declaration stops the mock at start with one
line naming it.

References are independent of the mock: numbers written into the folders and strings by the
test, ids checked against the declared vocabulary, and a fresh interpreter for the CLI.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ADAMW
from model_folders import write_model_folder

from mock_server import InProcessTransport, create_app
from mock_server.engine.specs import ModelSpec
from mock_server.testing import MockWhitney

API = "/v1/training"
KEY = "whitney-mock-key"
QWEN = "Qwen/Qwen3-4B:vocab_size=151936,eos=151645,bos=151643,max_context=40960"
QWEN_ENTRY = {"id": "Qwen/Qwen3-4B", "vocab_size": 151936, "max_context": 40960,
              "eos_token_id": 151645, "max_lora_rank": 64, "bos_token_id": 151643}
BYTE_ENTRY = {"id": "whitney-mock/tiny-byte", "vocab_size": 258, "max_context": 2048,
              "eos_token_id": 257, "max_lora_rank": 64, "bos_token_id": 256}


def client_for(**options: Any) -> httpx.Client:
    app = create_app(api_keys=(KEY,), **options)
    return httpx.Client(transport=InProcessTransport(app), base_url="http://mock",
                        headers={"Authorization": f"Bearer {KEY}"}, timeout=30)


def capabilities_models(client: httpx.Client) -> list[dict[str, Any]]:
    response = client.get(f"{API}/capabilities")
    assert response.status_code == 200
    return response.json()["base_models"]


def test_default_is_the_byte_model_with_its_bos() -> None:
    with client_for() as client:
        assert capabilities_models(client) == [BYTE_ENTRY]


def test_every_form_declares_the_same_models_in_order(tmp_path: Path) -> None:
    folder = write_model_folder(tmp_path / "tiny-bpe", model_vocab=200)
    forms: list[Any] = [
        QWEN,
        ModelSpec.declare("Qwen/Qwen3-4B", 151936, 151645, 151643, max_context=40960),
        dict(QWEN_ENTRY),
    ]
    for form in forms:
        with client_for(base_models=[form, folder.path, "whitney-mock/tiny-byte"]) as client:
            assert capabilities_models(client) == [
                QWEN_ENTRY,
                {"id": "tiny-bpe", "vocab_size": 200, "max_context": folder.max_context,
                 "eos_token_id": folder.eos_token_id, "max_lora_rank": 64,
                 "bos_token_id": folder.bos_token_id},
                BYTE_ENTRY]


def test_a_model_without_bos_has_no_bos_field_and_short_names_work() -> None:
    with client_for(base_models=[" tiny32 : vocab=32, eos=31 , max_lora_rank=8"]) as client:
        assert capabilities_models(client) == [{"id": "tiny32", "vocab_size": 32,
                                                "max_context": 2048, "eos_token_id": 31,
                                                "max_lora_rank": 8}]


def _run(client: httpx.Client, model: str, rank: int = 4) -> httpx.Response:
    session = client.post(f"{API}/sessions", json={}).json()["session_id"]
    return client.post(f"{API}/sessions/{session}/runs",
                       json={"base_model": model, "lora": {"rank": rank, "alpha": 8, "seed": 1},
                             "optimizer": "adamw"})


def test_runs_train_and_sample_on_a_declared_vocabulary() -> None:
    vocab, eos = 151936, 151645
    with client_for(base_models=[QWEN]) as client:
        created = _run(client, "Qwen/Qwen3-4B")
        assert created.status_code == 201, created.text
        runs = f"{API}/runs/{created.json()['run_id']}"
        tokens = [151643, 9707, 11, vocab - 1, 0, eos]
        datum = {"model_input": {"token_ids": tokens[:-1]},
                 "loss_inputs": {"target_tokens": tokens[1:]}}
        seq = iter(range(1, 100))
        fb = client.post(f"{runs}/forward_backward", json={
            "seq": next(seq), "loss_function": "cross_entropy", "loss_config": {},
            "data": [datum]})
        assert fb.status_code == 200, fb.text
        assert client.post(f"{runs}/optim_step",
                           json={"seq": next(seq), "adamw": ADAMW}).status_code == 200
        assert client.post(f"{runs}/save_weights_for_sampler",
                           json={"seq": next(seq), "version": 0}).status_code == 200
        sample = client.post(f"{runs}/sample", json={
            "seq": next(seq), "version": 0, "prompt": {"token_ids": [151643, 9707]},
            "num_samples": 8, "sampling": {"max_tokens": 16, "temperature": 1.0, "top_k": 0,
                                           "top_p": 1.0, "seed": 3}})
        assert sample.status_code == 200, sample.text
        ids = [t for s in sample.json()["sequences"] for t in s["tokens"]]
        assert all(0 <= t < vocab for t in ids)
        assert max(ids) > 258  # the declared vocabulary is used, not the byte model's
        outside = client.post(f"{runs}/logprobs", json={"seq": next(seq), "version": 0,
                                                       "token_ids": [1, vocab]})
        assert outside.status_code == 422 and str(vocab) in outside.json()["error"]["message"]


def test_unknown_model_names_the_served_ones() -> None:
    with client_for(base_models=[QWEN, "tiny32:vocab=32,eos=31"]) as client:
        refused = _run(client, "whitney-mock/tiny-byte")
        assert refused.status_code == 422
        error = refused.json()["error"]
        assert error["type"] == "unknown_base_model"
        assert error["details"]["base_models"] == ["Qwen/Qwen3-4B", "tiny32"]
        too_big = _run(client, "tiny32", rank=9)  # max_lora_rank defaults to 64: fine
        assert too_big.status_code == 201


BAD_DECLARATIONS = [
    ("x:vocab_size=1,eos=0", "vocab_size must be an integer in [2,"),
    ("x:vocab_size=32,eos=32", "eos_token_id 32 outside the vocabulary [0, 32)"),
    ("x:vocab_size=32,eos=3,bos=40", "bos_token_id 40 outside the vocabulary [0, 32)"),
    ("whitney-mock/tiny-byte:vocab_size=300,eos=257", "is the built-in model"),
    ("x:vocab_size=32", "needs eos_token_id"),
    ("x:vocab_size=32,eos=3,colour=4", "'colour=4' is not NAME=INTEGER"),
    ("x:vocab_size=thirty,eos=3", "is not a non-negative integer"),
    ("Qwen/Qwen3-4B", "give the model's numbers"),
]


@pytest.mark.parametrize(("declaration", "problem"), BAD_DECLARATIONS)
def test_bad_declarations_raise_one_line(declaration: str, problem: str) -> None:
    with pytest.raises(ValueError) as caught:
        create_app(base_models=[declaration])
    message = str(caught.value)
    assert problem in message and "\n" not in message


def test_bad_folders_and_duplicates_raise_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    cases = [
        ([tmp_path / "missing"], "no such folder"),
        ([broken], "config.json: not valid JSON"),
        ([tmp_path], "config.json: missing"),
        (["a:vocab=3,eos=1", {"id": "a", "vocab_size": 5, "eos_token_id": 1}],
         "base model 'a' declared twice"),
        ([{"id": "a", "vocab": 5}], "unknown key(s) ['vocab']"),
        ([ModelSpec.declare("whitney-mock/tiny-byte", 258, 0)], "is the built-in model"),
    ]
    for base_models, problem in cases:
        with pytest.raises(ValueError) as caught:
            create_app(base_models=base_models)
        assert problem in str(caught.value) and "\n" not in str(caught.value), caught.value


def test_mock_whitney_in_process_declares_models(tmp_path: Path) -> None:
    folder = write_model_folder(tmp_path / "tiny-bpe")
    with MockWhitney.in_process(base_models=[folder.path, "tiny32:vocab=32,eos=31"]) as mock:
        assert [m["id"] for m in capabilities_models(mock.client)] == ["tiny-bpe", "tiny32"]
        assert mock.base_models == capabilities_models(mock.client)


# -- python -m mock_server ------------------------------------------------------------------

def _mock_command(*args: str, env: dict[str, str] | None = None,
                  ) -> tuple[subprocess.Popen[str], str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "mock_server", "--port", str(port), *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **(env or {})})
    return process, f"http://127.0.0.1:{port}"


def _served_models(process: subprocess.Popen[str], root: str) -> tuple[list[dict[str, Any]],
                                                                       str]:
    """The served capabilities' base models and the banner's first line."""
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        deadline = time.monotonic() + 60
        while True:
            try:
                response = httpx.get(f"{root}{API}/capabilities",
                                     headers={"Authorization": f"Bearer {KEY}"})
                break
            except httpx.TransportError:
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline
                time.sleep(0.05)
        return response.json()["base_models"], banner
    finally:
        process.terminate()
        process.communicate(timeout=30)


def test_cli_serves_the_folder_model_and_names_the_base_url(tmp_path: Path) -> None:
    folder = write_model_folder(tmp_path / "tiny-bpe", model_vocab=128)
    process, root = _mock_command("--base-model-from", str(folder.path),
                                  "--base-model-from", f"org/named={folder.path}")
    models, banner = _served_models(process, root)
    numbers = {"vocab_size": 128, "max_context": folder.max_context,
               "eos_token_id": folder.eos_token_id, "max_lora_rank": 64,
               "bos_token_id": folder.bos_token_id}
    assert models == [{"id": "tiny-bpe", **numbers}, {"id": "org/named", **numbers}]
    assert f"--base-url {root} " in banner


def test_cli_reads_the_environment_when_no_flag_is_given(tmp_path: Path) -> None:
    folder = write_model_folder(tmp_path / "tiny-bpe")
    env = {"WHITNEY_MOCK_BASE_MODELS": f"{QWEN}; tiny32:vocab=32,eos=31",
           "WHITNEY_MOCK_BASE_MODEL_FROM": str(folder.path)}
    process, root = _mock_command(env=env)
    models, _ = _served_models(process, root)
    assert [m["id"] for m in models] == ["Qwen/Qwen3-4B", "tiny32", "tiny-bpe"]
    process, root = _mock_command("--base-model", "tiny32:vocab=32,eos=31", env=env)
    models, _ = _served_models(process, root)  # a flag replaces the environment
    assert [m["id"] for m in models] == ["tiny32"]


@pytest.mark.parametrize(("args", "problem"), [
    (["--base-model", "x:vocab_size=1,eos=0"], "vocab_size must be an integer in [2,"),
    (["--base-model", "x:vocab_size=32,eos=99"], "eos_token_id 99 outside the vocabulary"),
    (["--base-model-from", "/no/such/folder"], "/no/such/folder: no such folder"),
    (["--base-model", "whitney-mock/tiny-byte:vocab=300,eos=257"], "is the built-in model"),
])
def test_cli_bad_declaration_is_one_line_and_exit_2(args: list[str], problem: str) -> None:
    done = subprocess.run([sys.executable, "-m", "mock_server", "--port", "0", *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("whitney-mock: ") and problem in lines[0]


def test_cli_help_documents_the_syntax() -> None:
    done = subprocess.run([sys.executable, "-m", "mock_server", "--help"], capture_output=True,
                          text=True, timeout=60, check=True)
    text = " ".join(done.stdout.split())
    for needle in ("--base-model SPEC", "--base-model-from [ID=]DIR",
                   "ID:vocab_size=N,eos=N[,bos=N][,max_context=N][,max_lora_rank=N]",
                   "WHITNEY_MOCK_BASE_MODELS", "WHITNEY_MOCK_BASE_MODEL_FROM"):
        assert needle in text, needle


def test_folder_numbers_come_from_the_files_written(tmp_path: Path) -> None:
    folder = write_model_folder(tmp_path / "padded", model_vocab=300)
    config = json.loads((folder.path / "config.json").read_text())
    with client_for(base_models=[folder.path]) as client:
        (entry,) = capabilities_models(client)
    assert (entry["vocab_size"], entry["eos_token_id"], entry["bos_token_id"],
            entry["max_context"]) == (config["vocab_size"], config["eos_token_id"],
                                      config["bos_token_id"],
                                      config["max_position_embeddings"])


# -- the pytest plugin ----------------------------------------------------------------------

pytest_plugins = ["pytester"]

PLUGIN_TESTS = """
import pytest

def ids(mock):
    return [m["id"] for m in mock.client.get("/v1/training/capabilities").json()["base_models"]]

def test_session_settings(whitney_mock, whitney_server):
    assert ids(whitney_mock) == ids(whitney_server) == EXPECTED

@pytest.mark.whitney_mock(base_models=["q:vocab=100,eos=5", {"id": "d", "vocab_size": 9,
                                                             "eos_token_id": 0}])
def test_marker_replaces(whitney_mock, whitney_server):
    assert ids(whitney_mock) == ids(whitney_server) == ["q", "d"]

def test_server_back_to_session_settings(whitney_server):
    assert ids(whitney_server) == EXPECTED
"""


def test_plugin_ini_command_line_and_marker(pytester: pytest.Pytester) -> None:
    write_model_folder(pytester.path / "models" / "tiny-bpe")
    pytester.makeini("[pytest]\nwhitney_mock_base_models =\n    tiny32:vocab=32,eos=31\n"
                     "    whitney-mock/tiny-byte\n")
    pytester.makepyfile(test_ini=PLUGIN_TESTS.replace(
        "EXPECTED", "['tiny32', 'whitney-mock/tiny-byte']"))
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_ini.py").assert_outcomes(
        passed=3)
    pytester.makepyfile(test_cli=PLUGIN_TESTS.replace("EXPECTED", "['tiny-bpe']"))
    pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "test_cli.py",
        "--whitney-mock-base-model-from", "models/tiny-bpe").assert_outcomes(passed=3)


def test_plugin_bad_declaration_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x(whitney_mock):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           "--whitney-mock-base-model", "x:vocab=32,eos=32")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if "whitney-mock" in line]
    assert errors == ["ERROR: whitney-mock base models (command line): base model 'x': "
                      "eos_token_id 32 outside the vocabulary [0, 32)"]
