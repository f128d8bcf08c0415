"""`aot serve`: transformers' own OpenAI-compatible server (`transformers serve`) for AoT folders.

`build_app` builds transformers' FastAPI app from transformers' handlers, as `Serve` does and from the same options,
and changes no transformers class or module attribute. What it adds at the boundary:

- **Loading** through `AutoModelForCausalLM` when `config.architectures[0]` is not a transformers class (a remote-code
  folder), so `--trust-remote-code` runs the folder's own code and, without it, this package's classes.
- **Start-up checks**: a k-NN model (`knn_k` set) under `--continuous-batching` is refused (transformers' paged
  kernels attend to every key); a folder without a chat template is named, and refused with chat options.
- **Request checks** (`CheckedHandler`): a malformed field (token limits, `model`, the prompt, sampling options) gets
  a 4xx naming it in OpenAI's error shape (`error.message`, `error.param`), never a 500. A request without a token
  limit generates up to the end of the context (`max_position_embeddings`), where transformers' default (1024 new
  tokens) would run past the learned position embeddings.

Nothing here is specific to AoT but the k-NN check: any causal LM a folder maps with `auto_map` serves the same way.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, ProcessorMixin
    from transformers.cli.serving.model_manager import ModelManager
    from transformers.cli.serving.utils import BaseHandler

    Processor = ProcessorMixin | PreTrainedTokenizerBase  # what `ModelManager.load_model_and_processor` gives

try:  # `aot serve`; this file also runs on its own, where only transformers is installed (see `main`)
    from .errors import UsageError
except ImportError:

    class UsageError(ValueError):
        def __init__(self, message: str = "", *, argument: str | None = None):
            super().__init__(f"{argument}: {message}" if argument else message)


# `Serve`'s options `build_app` (`serve`: host, port) reads besides those it hands on by name (ModelManager's, `cb_*`),
# and `non_blocking`, a test hook it leaves (`aot serve` runs in the foreground); tests/test_serve.py names a new one.
SERVE_OPTIONS = {*"force_model continuous_batching trust_remote_code compile reasoning chat_template_kwargs".split()}
SERVE_OPTIONS |= {*"decision_config enable_cors log_level default_seed host port non_blocking".split()}
SERVE_HELP = (
    "serve a model folder or Hub id with transformers' OpenAI-compatible server (`transformers serve`); every "
    "`transformers serve` option is accepted after the model (`aot serve MODEL --help` lists them)"
)


class RequestError(Exception):
    """A request that is refused at the boundary: an HTTP status, the field at fault and the message."""

    def __init__(self, status: int, param: str | None, message: str, code: str = "invalid_request"):
        super().__init__(message)
        self.status, self.param, self.message, self.code = status, param, message, code

    def response(self) -> JSONResponse:
        from fastapi.responses import JSONResponse

        error = {"message": self.message, "type": "invalid_request_error", "param": self.param, "code": self.code}
        return JSONResponse({"error": error}, status_code=self.status)


def _field(body: dict, field: str, ok: Callable[[Any], bool], allowed: str, required: bool = False) -> Any:
    """`body[field]` (None when absent); a 400 naming the field and what is `allowed` when `ok(value)` is false (an
    absent field is checked too when `required`)."""
    value = body.get(field)
    if (value is not None or required) and not ok(value):
        raise RequestError(400, field, f"{field}: {value!r} is not allowed (allowed: {allowed})")
    return value


def _is_number(value: Any, kind: type | tuple[type, ...] = (int, float)) -> bool:  # a bool is not one
    return isinstance(value, kind) and not isinstance(value, bool)


def check_common_fields(body: dict, served: str) -> None:
    """Checks every endpoint shares: the model name and the sampling fields."""
    requested = body.get("model")
    if requested is not None and requested != served:
        raise RequestError(
            404, "model", f"model: {requested!r} is not served here (this server serves {served!r})", "model_not_found"
        )
    _field(body, "temperature", lambda v: _is_number(v) and 0.0 <= v <= 2.0, "a number in [0.0, 2.0]")
    _field(body, "top_p", lambda v: _is_number(v) and 0.0 < v <= 1.0, "a number in (0.0, 1.0]")
    _field(body, "stream", lambda v: isinstance(v, bool), "true or false")
    _field(body, "seed", lambda v: _is_number(v, int), "an integer")


def fit_to_context(body: dict, fields: tuple[str, ...], prompt_tokens: int, model: PreTrainedModel, what: str) -> None:
    """Refuse a prompt or a token limit the model's context (`max_position_embeddings`) cannot hold; default the
    limit to what is left."""
    limits = {f: _field(body, f, lambda v: _is_number(v, int) and v >= 1, "a positive integer") for f in fields}
    if prompt_tokens == 0:
        raise RequestError(400, what, f"{what}: empty (allowed: at least one token)")
    context = getattr(model.config, "max_position_embeddings", None)
    if not isinstance(context, int) or context < 1:
        return
    if prompt_tokens >= context:
        why = f"{what}: {prompt_tokens} tokens, the model's context is {context} tokens (room for none to generate)"
        raise RequestError(400, what, why, "context_length_exceeded")
    field, limit = next(((f, v) for f, v in limits.items() if v is not None), (fields[-1], None))
    if limit is None:
        body[fields[-1]] = context - prompt_tokens  # transformers' default (1024) would run past the positions
    elif prompt_tokens + limit > context:
        why = (
            f"{field}: {limit} new tokens after a {prompt_tokens}-token prompt exceed the model's context of "
            f"{context} tokens (allowed: at most {context - prompt_tokens})"
        )
        raise RequestError(400, field, why, "context_length_exceeded")


def _tokenizer(processor: Processor) -> PreTrainedTokenizerBase:
    return getattr(processor, "tokenizer", processor)


def _chat_template_missing(processor: Processor) -> bool:
    return not getattr(_tokenizer(processor), "chat_template", None) and not getattr(processor, "chat_template", None)


NO_CHAT_TEMPLATE = (
    "{name} has no chat template (no chat_template.jinja, no `chat_template` in tokenizer_config.json): "
    "/v1/chat/completions and /v1/responses cannot format messages; use /v1/completions, or save a tokenizer "
    "with a chat template into the folder"
)


def _chat_prompt_tokens(handler: BaseHandler, processor: Processor, messages: list, body: dict) -> int:
    from transformers.cli.serving.utils import Modality

    kwargs = {**handler.chat_template_kwargs, **(body.get("chat_template_kwargs") or {})}
    ids = _tokenizer(processor).apply_chat_template(
        handler.get_processor_inputs_from_messages(messages, Modality.LLM),
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        tools=body.get("tools"),
        **kwargs,
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return len(ids[0]) if ids and isinstance(ids[0], list) else len(ids)


def check_completion(
    handler: BaseHandler, body: dict, model: PreTrainedModel, processor: Processor, served: str
) -> None:
    """`/v1/completions`: a non-empty string prompt that leaves room in the context for `max_tokens`."""
    prompt = _field(body, "prompt", lambda v: isinstance(v, str) and bool(v), "a non-empty string", required=True)
    tokens = len(_tokenizer(processor)(prompt)["input_ids"])
    fit_to_context(body, ("max_tokens",), tokens, model, "prompt")


def check_chat(handler: BaseHandler, body: dict, model: PreTrainedModel, processor: Processor, served: str) -> None:
    """`/v1/chat/completions`: messages with a role, a chat template to format them, room for the token limit."""
    messages = _field(body, "messages", lambda v: isinstance(v, list) and bool(v), "a non-empty list", required=True)
    for index, message in enumerate(messages):
        field = f"messages[{index}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(400, field, f"{field}: a message needs a `role` and a `content`")
    if not isinstance(body.get("chat_template_kwargs") or {}, dict):
        raise RequestError(400, "chat_template_kwargs", "chat_template_kwargs: not a JSON object")
    if _chat_template_missing(processor):
        raise RequestError(400, "messages", NO_CHAT_TEMPLATE.format(name=served), "no_chat_template")
    tokens = _chat_prompt_tokens(handler, processor, messages, body)
    # transformers reads `max_completion_tokens` first, then `max_tokens`: both are checked
    fit_to_context(body, ("max_completion_tokens", "max_tokens"), tokens, model, "messages")


def check_response(
    handler: BaseHandler, body: dict, model: PreTrainedModel, processor: Processor, served: str
) -> None:
    """`/v1/responses`: some input, a chat template to format it, room for `max_output_tokens`."""
    _field(body, "input", lambda v: v not in (None, "", []), "text", required=True)
    if _chat_template_missing(processor):
        raise RequestError(400, "input", NO_CHAT_TEMPLATE.format(name=served), "no_chat_template")
    messages = handler._normalize_input(dict(body))
    tokens = _chat_prompt_tokens(handler, processor, messages, {**body, "tools": None})
    fit_to_context(body, ("max_output_tokens",), tokens, model, "input")


class CheckedHandler:
    """A transformers handler behind `check_common_fields` and `check`: a refused request gets its `RequestError`."""

    def __init__(
        self, handler: BaseHandler, check: Callable[[BaseHandler, dict, PreTrainedModel, Processor, str], None]
    ):
        self.handler, self.check = handler, check

    async def handle_request(self, body: dict, request_id: str) -> StreamingResponse | JSONResponse:
        manager, served = self.handler.model_manager, self.handler.model_manager.force_model
        try:
            model, processor = manager.load_model_and_processor(manager.process_model_name(served))
            check_common_fields(body, served)
            self.check(self.handler, body, model, processor, served)
        except RequestError as error:
            return error.response()
        return await self.handler.handle_request(body, request_id)


def _model_manager(options: dict) -> ModelManager:
    """transformers' `ModelManager` for `transformers serve`'s `options`, loading through `AutoModelForCausalLM` when
    the architecture is not a transformers class (a remote-code model): transformers looks it up in its namespace."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.cli.serving.model_manager import ModelManager
    from transformers.cli.serving.utils import split_revision

    class CausalLMModelManager(ModelManager):
        def _load_model(
            self,
            model_id_and_revision: str,
            tqdm_class: type | None = None,
            progress_callback: Callable | None = None,
            gguf_file: str | None = None,
        ) -> PreTrainedModel:
            model_id, revision = split_revision(model_id_and_revision)
            remote = self.trust_remote_code
            if gguf_file is None:
                config = AutoConfig.from_pretrained(model_id, revision=revision, trust_remote_code=remote)
                if not hasattr(transformers, (config.architectures or [""])[0]):
                    return AutoModelForCausalLM.from_pretrained(
                        model_id,
                        revision=revision,
                        attn_implementation=self.attn_implementation,
                        dtype=self.dtype,
                        device_map=self.device,
                        trust_remote_code=remote,
                        tqdm_class=tqdm_class,
                        quantization_config=self.get_quantization_config(),
                    )
            return super()._load_model(model_id_and_revision, tqdm_class, progress_callback, gguf_file)

    # its arguments are `transformers serve` options of the same names
    return CausalLMModelManager(**{name: options[name] for name in inspect.signature(ModelManager).parameters})


def build_app(options: dict) -> FastAPI:
    """transformers' FastAPI app for `Serve`'s arguments `options`, built from transformers' classes as
    `Serve.__init__` builds it, with this module's start-up checks, model manager and request checks."""
    from transformers import AutoConfig, ContinuousBatchingConfig
    from transformers.cli.serving import chat_completion, completion, response, server, systemone, transcription
    from transformers.cli.serving.utils import GenerationState, set_torch_seed, split_revision
    from transformers.utils import logging

    o = argparse.Namespace(**{key: value for key, value in options.items() if key in SERVE_OPTIONS})
    name = o.force_model
    if o.default_seed is not None:
        set_torch_seed(o.default_seed)
    logging.get_logger("transformers").setLevel(logging.log_levels[o.log_level.lower()])
    if o.continuous_batching:
        model_id, revision = split_revision(name)
        config = AutoConfig.from_pretrained(model_id, revision=revision, trust_remote_code=o.trust_remote_code)
        if getattr(config, "knn_k", None) is not None:
            raise UsageError(
                f"{name} is a k-NN model (knn_k={config.knn_k}) and transformers' paged kernels attend to every "
                "key; serve it without --continuous-batching",
                argument="--continuous-batching",
            )
    manager = _model_manager(options)
    model, processor = manager.load_model_and_processor(manager.process_model_name(name))
    module = type(model).__module__
    code = "the folder's own code (--trust-remote-code)" if module.startswith("transformers_modules") else module
    print(f"aot serve: {name}: {type(model).__name__} from {code}", file=sys.stderr)
    if _chat_template_missing(processor):
        print(f"aot serve: note: {NO_CHAT_TEMPLATE.format(name=name)}", file=sys.stderr)
    chat_template_kwargs = json.loads(o.chat_template_kwargs) if o.chat_template_kwargs else {}
    if not isinstance(chat_template_kwargs, dict):
        raise UsageError("must be a JSON object", argument="--chat-template-kwargs")
    if o.reasoning != "auto":  # `--reasoning on|off`
        chat_template_kwargs["enable_thinking"] = o.reasoning == "on"
    if chat_template_kwargs and _chat_template_missing(processor):
        raise UsageError(NO_CHAT_TEMPLATE.format(name=name), argument="chat options")
    cb_options = {key[3:]: value for key, value in options.items() if key.startswith("cb_") and value is not None}
    cb_config = ContinuousBatchingConfig(**cb_options) if cb_options else None
    state = GenerationState(continuous_batching=o.continuous_batching, compile=o.compile, cb_config=cb_config)
    shared = {"model_manager": manager, "generation_state": state}
    chat = {**shared, "chat_template_kwargs": chat_template_kwargs}
    return server.build_server(
        manager,
        CheckedHandler(chat_completion.ChatCompletionHandler(**chat), check_chat),
        completion_handler=CheckedHandler(completion.CompletionHandler(**shared), check_completion),
        response_handler=CheckedHandler(response.ResponseHandler(**chat), check_response),
        transcription_handler=transcription.TranscriptionHandler(manager, state),
        systemone_handler=systemone.SystemOneHandler(**chat, decision_config=o.decision_config),
        generation_state=state,
        enable_cors=o.enable_cors,
    )


def serve(model: str, options: list[str]) -> int:
    """Run `transformers serve MODEL OPTIONS...` (its own typer options) on `build_app`; returns when it stops."""
    from transformers.utils.import_utils import is_serve_available

    if not is_serve_available():
        raise UsageError(
            "transformers' server needs fastapi, uvicorn, pydantic and openai: "
            "pip install 'aot-transformers[serve]' (or 'transformers[serving]')"
        )
    import typer
    import uvicorn
    from transformers.cli.serve import Serve

    try:  # recent typer carries its own copy of click
        from typer._click.exceptions import ClickException
    except ImportError:
        from click import ClickException

    def run(**arguments) -> int:  # in the foreground under --non-blocking too (`SERVE_OPTIONS`)
        config = uvicorn.Config(build_app(arguments), host=arguments["host"], port=arguments["port"], log_level="info")
        uvicorn.Server(config).run()
        return 0

    run.__signature__ = inspect.signature(Serve)  # typer reads `transformers serve`'s options from it
    app = typer.Typer(add_completion=False)
    app.command(help=Serve.__doc__)(run)
    try:  # returns 0 after --help too
        return typer.main.get_command(app).main(args=[model, *options], prog_name="aot serve", standalone_mode=False)
    except ClickException as error:  # a bad option: one line, exit code 2
        raise UsageError(error.format_message()) from None


def register(subcommands: argparse._SubParsersAction) -> None:
    """Add `aot serve` to the `aot` command."""
    parser = subcommands.add_parser("serve", help=SERVE_HELP, description=SERVE_HELP)
    parser.add_argument("model", help="a model folder (save_pretrained / aot train) or a Hub id")
    parser.add_argument(
        "options",
        nargs=argparse.REMAINDER,
        help="transformers serve options: --port, --host, --continuous-batching, --trust-remote-code, --dtype, ...",
    )
    parser.set_defaults(func=lambda args: serve(args.model, args.options))


def main(argv: list[str] | None = None) -> int:
    """`python serving.py MODEL [transformers serve options]`: the same server where aot-transformers is not installed
    (the file alone, next to transformers[serving]); with `--trust-remote-code` the folder's own code runs."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        print(f"usage: python serving.py MODEL [transformers serve options]\n{SERVE_HELP}", file=sys.stderr)
        return 2
    try:
        return serve(argv[0], argv[1:])
    except ValueError as error:
        print(f"serving.py: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
