"""`aot serve`: transformers' own server, started for real on a free loopback port, driven by the `openai` client.

Three servers start together (their start-ups overlap) and are always stopped: `aot serve` on a dense folder, the
same module run as a lone file in a process where `aot_transformers` cannot be imported (the folder's own code,
`--trust-remote-code`, under `--continuous-batching`), and `aot serve` on a k-NN folder without a chat template.
One more app is built in this process, to see that building and serving it leaves transformers' modules as they were,
and one beside `Serve.__init__`'s own, to see that `build_app` mirrors it: every `transformers serve` option is read
or knowingly left, and transformers' classes get the arguments `Serve` gives them (a later transformers adding one
fails here).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import json
import os
import pkgutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from aot_transformers import AoTConfig, AoTForCausalLM
from support import REPO_ROOT, SHARED_DATA

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

SERVING_FILE = REPO_ROOT / "src" / "aot_transformers" / "serving.py"
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
# A small paged cache: transformers sizes the default one from free memory, which takes seconds to allocate on CPU.
CB_CACHE = ["--cb-num-blocks", "32", "--cb-block-size", "32"]
PROMPTS = ["Hello world", "The quick brown fox", "To be, or not to be", "Attention is all you need"]


def _save_folder(folder: Path, *, knn: bool, chat: bool) -> None:
    from transformers import GPT2TokenizerFast

    tokenizer = GPT2TokenizerFast.from_pretrained(SHARED_DATA / "tokenizer-gpt2")
    tokenizer.pad_token = tokenizer.eos_token
    if chat:
        tokenizer.chat_template = CHAT_TEMPLATE
    eos = tokenizer.eos_token_id
    fields = dict(vocab_size=len(tokenizer), pad_token_id=eos, eos_token_id=eos, bos_token_id=eos)
    # A wide initialisation spreads the logits of the untrained model: no near-ties for greedy decoding to flip.
    config = AoTConfig.from_preset("aot-mssa-l-tiny", initializer_range=0.2, knn_k=0.5 if knn else None, **fields)
    torch.manual_seed(0)
    AoTForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _env(tmp: Path) -> dict:
    path = [str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(tmp / "modules"),
        "OMP_NUM_THREADS": "1",
    }


class Server:
    """A server process on a free loopback port, its log in a file."""

    def __init__(self, command: list[str], folder: Path, tmp: Path, name: str):
        self.port, self.folder, self.name = _free_port(), str(folder), name
        self.log = tmp / f"{name}.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [*command, "--host", "127.0.0.1", "--port", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_env(tmp),
                cwd=tmp,
            )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"{self.name} exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        pytest.fail(f"{self.name} not ready after {timeout} s:\n{self.log.read_text()[-3000:]}")

    def client(self):
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """A dense folder with a chat template and a k-NN folder without one."""
    if not (SHARED_DATA / "tokenizer-gpt2").exists():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    tmp = tmp_path_factory.mktemp("folders")
    _save_folder(tmp / "dense", knn=False, chat=True)
    _save_folder(tmp / "knn", knn=True, chat=False)
    return {"dense": tmp / "dense", "knn": tmp / "knn"}


@pytest.fixture(scope="module")
def servers(folders, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    dense, knn = folders["dense"], folders["knn"]
    alone = textwrap.dedent(
        f"""
        import runpy, sys
        sys.modules["aot_transformers"] = None  # as where the package is not installed
        sys.argv = ["serving.py", *sys.argv[1:]]
        runpy.run_path({str(SERVING_FILE)!r}, run_name="__main__")
        """
    )
    aot = [sys.executable, "-m", "aot_transformers.cli", "serve"]
    started = {
        "dense": Server([*aot, str(dense)], dense, tmp, "dense"),
        "remote_cb": Server(
            [sys.executable, "-c", alone, str(dense), "--trust-remote-code", "--continuous-batching", *CB_CACHE],
            dense,
            tmp,
            "remote_cb",
        ),
        "knn": Server([*aot, str(knn)], knn, tmp, "knn"),
    }
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="module")
def reference(servers):
    """Greedy `generate` in this process, on the folders the servers load."""
    from transformers import AutoTokenizer

    cache = {}

    def greedy(folder: str, prompt: str | list[dict], max_new_tokens: int) -> str:
        if folder not in cache:
            cache[folder] = (AoTForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder))
        model, tokenizer = cache[folder]
        if isinstance(prompt, str):
            ids = tokenizer(prompt, return_tensors="pt").input_ids
        else:
            ids = tokenizer.apply_chat_template(
                prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True
            )
            ids = ids["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    return greedy


@pytest.mark.parametrize("name", ["dense", "remote_cb", "knn"])
def test_completions_equal_generate(servers, reference, name):
    server = servers[name]
    answer = server.client().completions.create(model=server.folder, prompt=PROMPTS[0], max_tokens=12, temperature=0)
    assert answer.choices[0].text == reference(server.folder, PROMPTS[0], 12)
    assert answer.usage.completion_tokens <= 12
    assert [m.id for m in server.client().models.list().data] == [server.folder]


@pytest.mark.parametrize("name", ["dense", "remote_cb"])
def test_concurrent_requests_equal_generate(servers, reference, name):
    server = servers[name]
    client = server.client()

    def ask(i):
        return client.completions.create(model=server.folder, prompt=PROMPTS[i], max_tokens=6 + 2 * i, temperature=0)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(ask, range(len(PROMPTS))))
    assert [a.choices[0].text for a in answers] == [
        reference(server.folder, p, 6 + 2 * i) for i, p in enumerate(PROMPTS)
    ]


@pytest.mark.parametrize("name", ["dense", "remote_cb"])
def test_streaming_and_chat_with_the_folders_template(servers, reference, name):
    server = servers[name]
    client = server.client()
    chunks = client.completions.create(
        model=server.folder, prompt=PROMPTS[1], max_tokens=10, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in chunks) == reference(server.folder, PROMPTS[1], 10)
    messages = [{"role": "user", "content": "Where is the fox?"}]
    answer = client.chat.completions.create(model=server.folder, messages=messages, max_tokens=8, temperature=0)
    assert answer.choices[0].message.content == reference(server.folder, messages, 8)
    stream = client.chat.completions.create(
        model=server.folder, messages=messages, max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == reference(
        server.folder, messages, 8
    )


def test_a_request_without_a_limit_stops_at_the_end_of_the_context(servers):
    server = servers["dense"]
    answer = server.client().completions.create(model=server.folder, prompt="Hi", temperature=0)
    assert answer.usage.prompt_tokens + answer.usage.completion_tokens <= 256  # the preset's max_position_embeddings


BAD_COMPLETIONS = [
    ({"max_tokens": -3}, 400, "max_tokens"),
    ({"max_tokens": 2.5}, 400, "max_tokens"),
    ({"max_tokens": "8"}, 400, "max_tokens"),
    ({"max_tokens": 1000}, 400, "max_tokens"),  # past the model's context
    ({"prompt": ""}, 400, "prompt"),
    ({"model": "no-such-model"}, 404, "model"),
    ({"temperature": -1}, 400, "temperature"),
    ({"top_p": 0}, 400, "top_p"),
]


@pytest.mark.parametrize("name", ["dense", "remote_cb"])
def test_malformed_requests_get_a_4xx_naming_the_field_and_the_server_keeps_serving(servers, name):
    server = servers[name]
    client = server.client()
    for change, status, field in BAD_COMPLETIONS:
        request = {"model": server.folder, "prompt": "Hello", "max_tokens": 4, **change}
        with pytest.raises(openai.APIStatusError) as error:
            client.completions.create(**request)
        assert error.value.status_code == status, (change, error.value)
        assert error.value.body["param"] == field and error.value.body["message"].startswith(field), error.value.body
    for change, field in [({"messages": []}, "messages"), ({"max_completion_tokens": 0}, "max_completion_tokens")]:
        request = {"model": server.folder, "messages": [{"role": "user", "content": "hi"}], **change}
        with pytest.raises(openai.BadRequestError) as error:
            client.chat.completions.create(**request)
        assert error.value.body["param"] == field, error.value.body
    assert client.completions.create(model=server.folder, prompt="Hello", max_tokens=2).choices[0].text


def test_chat_without_a_chat_template_is_a_400_and_named_at_start_up(servers):
    server = servers["knn"]
    with pytest.raises(openai.BadRequestError) as error:
        server.client().chat.completions.create(
            model=server.folder, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert "has no chat template" in error.value.body["message"] and error.value.body["param"] == "messages"
    assert "has no chat template" in server.log.read_text()


def test_the_lone_file_serves_the_folders_own_code(servers):
    assert "AoTForCausalLM from the folder's own code" in servers["remote_cb"].log.read_text()
    assert "AoTForCausalLM from aot_transformers.modeling_aot" in servers["dense"].log.read_text()


def test_start_up_refusals_are_one_line(servers, tmp_path):
    knn = servers["knn"].folder
    runs = {
        "knn_cb": [knn, "--continuous-batching"],
        "chat": [knn, "--chat-template-kwargs", json.dumps({"enable_thinking": False})],
        "option": [knn, "--no-such-option"],
    }
    started = {}
    for name, args in runs.items():  # started together: each pays the import of torch and transformers
        command = [sys.executable, "-m", "aot_transformers.cli", "serve", *args, "--port", str(_free_port())]
        started[name] = subprocess.Popen(
            command, env=_env(tmp_path), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    results = {}
    for name, process in started.items():
        try:
            _, stderr = process.communicate(timeout=120)
        finally:
            process.kill()
        results[name] = (process.returncode, stderr.strip().splitlines())
    assert results["knn_cb"] == (
        2,
        [
            f"aot serve: error: --continuous-batching: {knn} is a k-NN model (knn_k=0.5) and transformers' paged "
            "kernels attend to every key; serve it without --continuous-batching"
        ],
    ), results["knn_cb"]
    code, lines = results["chat"]
    assert code == 2 and lines[-1].startswith("aot serve: error: chat options:"), results["chat"]
    code, lines = results["option"]
    assert code == 2 and lines[-1].startswith("aot serve: error: No such option: --no-such-option"), results["option"]


def _transformers_cli_attributes() -> dict:
    """Every attribute of every loaded `transformers.cli` module and of every class defined in one."""
    found = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("transformers.cli") and module is not None:
            for attribute, value in vars(module).items():
                found[(name, attribute)] = value
                if inspect.isclass(value) and value.__module__ == name:
                    found.update({(f"{name}.{attribute}", key): item for key, item in vars(value).items()})
    return found


async def _post(app, path: str, body: dict) -> tuple[int, dict]:
    """POST `body` through an ASGI `app` (its middleware and routes), with no socket and no HTTP client."""
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http"}
    scope.update(path=path, raw_path=path.encode(), query_string=b"", root_path="", headers=headers)
    requests, sent = [{"type": "http.request", "body": payload, "more_body": False}], []

    async def receive():
        if requests:
            return requests.pop()
        await asyncio.Event().wait()  # a client that stays connected

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    status = next(message["status"] for message in sent if message["type"] == "http.response.start")
    return status, json.loads(b"".join(message.get("body", b"") for message in sent))


def test_building_the_app_and_serving_requests_change_no_attribute_of_transformers_cli(folders):
    import transformers.cli.serve
    import transformers.cli.serving

    for module in pkgutil.iter_modules(transformers.cli.serving.__path__, "transformers.cli.serving."):
        importlib.import_module(module.name)  # loaded before the snapshot: loading a module adds it to its package
    before = _transformers_cli_attributes()
    from aot_transformers.serving import build_app

    options = {
        name: parameter.default
        for name, parameter in inspect.signature(transformers.cli.serve.Serve).parameters.items()
    }
    app = build_app({**options, "force_model": str(folders["dense"])})
    request = {"model": str(folders["dense"]), "prompt": "Hello", "max_tokens": 3, "temperature": 0}
    good = asyncio.run(_post(app, "/v1/completions", request))
    bad = asyncio.run(_post(app, "/v1/completions", {**request, "max_tokens": -3}))
    after = _transformers_cli_attributes()
    assert good[0] == 200 and good[1]["usage"]["completion_tokens"] == 3, good
    assert bad[0] == 400 and bad[1]["error"]["param"] == "max_tokens", bad
    missing = object()
    changed = [key for key in before.keys() | after.keys() if before.get(key, missing) is not after.get(key, missing)]
    assert sorted(".".join(key) for key in changed) == []


def test_build_app_reads_or_knowingly_leaves_every_transformers_serve_option():
    """`aot serve` accepts every `transformers serve` option (typer reads `Serve`'s signature), so an option a later
    transformers adds would be accepted and silently ignored unless `build_app` reads it: each option is read by name
    (`SERVE_OPTIONS`), handed to `ModelManager` by name, or a `cb_*` field of `ContinuousBatchingConfig`."""
    from transformers import ContinuousBatchingConfig
    from transformers.cli.serve import Serve
    from transformers.cli.serving.model_manager import ModelManager

    from aot_transformers.serving import SERVE_OPTIONS

    options = set(inspect.signature(Serve.__init__).parameters) - {"self"}
    manager = set(inspect.signature(ModelManager).parameters)
    batching = {name for name in options if name.startswith("cb_")}
    new = sorted(options - SERVE_OPTIONS - manager - batching)
    assert not new, f"`transformers serve` options that build_app neither reads nor leaves knowingly: {new}"
    assert not (gone := sorted((SERVE_OPTIONS | manager) - options)), f"build_app reads options Serve lacks: {gone}"
    fields = set(inspect.signature(ContinuousBatchingConfig).parameters)
    unknown = sorted(name for name in batching if name[3:] not in fields)
    assert not unknown, f"`cb_*` options that are no ContinuousBatchingConfig field: {unknown}"


# What `Serve.__init__` builds its app from: (module of transformers.cli.serving or None for transformers, name).
COMPOSED = [
    ("model_manager", "ModelManager"),
    ("chat_completion", "ChatCompletionHandler"),
    ("completion", "CompletionHandler"),
    ("response", "ResponseHandler"),
    ("transcription", "TranscriptionHandler"),
    ("systemone", "SystemOneHandler"),
    ("server", "build_server"),
    ("utils", "GenerationState"),
    ("utils", "set_torch_seed"),
    (None, "ContinuousBatchingConfig"),
]


def _plain(name: str, value):
    """An argument as the comparison sees it: plain data as is, objects (handlers, managers) by kind only."""
    return value if name != "force_model" and isinstance(value, (str, int, float, bool, dict, type(None))) else "…"


def test_build_app_composes_transformers_classes_with_the_arguments_serve_gives_them(folders, monkeypatch):
    """The same options through `Serve.__init__` (its server not run, no model preloaded) and through `build_app`:
    each transformers callable `Serve` composes (`COMPOSED`) is called by both, with the same positional count and
    keyword names and the same plain values. An argument a later `Serve` passes (a new handler parameter) fails here,
    and so does a transformers.cli.serving class or function it calls that `COMPOSED` does not list."""
    import transformers
    import transformers.cli.serve
    import transformers.cli.serving
    import uvicorn
    from transformers.cli.serve import Serve

    from aot_transformers.serving import build_app

    serving = [
        importlib.import_module(m.name)
        for m in pkgutil.iter_modules(transformers.cli.serving.__path__, "transformers.cli.serving.")
    ]
    called = {
        name
        for name in Serve.__init__.__code__.co_names
        for module in serving
        if getattr(getattr(module, name, None), "__module__", "").startswith("transformers.cli.serving")
    }
    unlisted = sorted(called - {name for _, name in COMPOSED})
    assert not unlisted, f"Serve.__init__ calls transformers.cli.serving names COMPOSED does not list: {unlisted}"
    calls = []

    def recorder(name, original, method: bool):
        @functools.wraps(original)  # its signature stays the original's (build_app reads ModelManager's)
        def record(*args, **kwargs):
            keywords = sorted((key, _plain(key, value)) for key, value in kwargs.items())
            calls.append((name, len(args) - method, keywords))
            return original(*args, **kwargs)

        return record

    for module, name in COMPOSED:
        owner = transformers if module is None else importlib.import_module(f"transformers.cli.serving.{module}")
        target = getattr(owner, name)
        if inspect.isclass(target):
            monkeypatch.setattr(target, "__init__", recorder(name, target.__init__, True))
        else:
            monkeypatch.setattr(owner, name, recorder(name, target, False))
            if hasattr(transformers.cli.serve, name):  # imported by name into serve.py
                monkeypatch.setattr(transformers.cli.serve, name, getattr(owner, name))
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: None)
    options = {name: p.default for name, p in inspect.signature(Serve.__init__).parameters.items() if name != "self"}
    options |= {"reasoning": "off", "chat_template_kwargs": '{"style": "short"}', "default_seed": 0}
    options |= {"enable_cors": True, "cb_num_blocks": 8, "cb_block_size": 16, "model_timeout": 60}
    Serve(**{**options, "force_model": None})
    by_serve = sorted(calls, key=repr)
    calls.clear()
    build_app({**options, "force_model": str(folders["dense"])})
    assert [call[0] for call in by_serve] == sorted(name for _, name in COMPOSED)
    assert sorted(calls, key=repr) == by_serve
