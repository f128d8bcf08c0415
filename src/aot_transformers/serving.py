"""`aot serve`: transformers' own OpenAI-compatible server (`transformers serve`) for AoT folders.

transformers' serving stack runs unchanged (typer options, FastAPI app, handlers, continuous batching); subclasses of
the classes `Serve` builds change three things at its boundary:

- **Loading** goes through `AutoModelForCausalLM` when `config.architectures[0]` is not a transformers class (a
  remote-code folder), so `--trust-remote-code` runs the folder's own code and, without it, this package's classes.
- **Start-up checks**: a k-NN model (`knn_k` set) under `--continuous-batching` is refused (transformers' paged
  kernels attend to every key); a folder without a chat template is named, and refused with chat options.
- **Requests**: a malformed field (token limits, `model`, the prompt, sampling options) gets a 4xx naming it in
  OpenAI's error shape (`error.message`, `error.param`), never a 500. A request without a token limit generates up
  to the end of the context (`max_position_embeddings`), where transformers' default (1024 new tokens) would run
  past the learned position embeddings.

Nothing here is specific to AoT but the k-NN check: any causal LM a folder maps with `auto_map` serves the same way.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

try:  # `aot serve`; this file also runs on its own, where only transformers is installed (see `main`)
    from .errors import UsageError
except ImportError:

    class UsageError(ValueError):
        def __init__(self, message: str = "", *, argument: str | None = None):
            super().__init__(f"{argument}: {message}" if argument else message)


SERVE_HELP = (
    "serve a model folder or Hub id with transformers' OpenAI-compatible server (`transformers serve`); every "
    "`transformers serve` option is accepted after the model (`aot serve MODEL --help` lists them)"
)


class RequestError(Exception):
    """A request that is refused at the boundary: an HTTP status, the field at fault and the message."""

    def __init__(self, status: int, param: str | None, message: str, code: str = "invalid_request"):
        super().__init__(message)
        self.status, self.param, self.message, self.code = status, param, message, code

    def response(self):
        from fastapi.responses import JSONResponse

        error = {"message": self.message, "type": "invalid_request_error", "param": self.param, "code": self.code}
        return JSONResponse({"error": error}, status_code=self.status)


def _field(body: dict, field: str, ok, allowed: str) -> Any:
    """`body[field]` (None when absent); a 400 naming the field and what is `allowed` when `ok(value)` is false."""
    value = body.get(field)
    if value is not None and not ok(value):
        raise RequestError(400, field, f"{field}: {value!r} is not allowed (allowed: {allowed})")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
    _field(body, "seed", _is_int, "an integer")


def fit_to_context(body: dict, fields: tuple[str, ...], prompt_tokens: int, model, what: str) -> None:
    """Refuse a prompt or a token limit the model's context (`max_position_embeddings`) cannot hold; default the
    limit to what is left."""
    limits = {field: _field(body, field, lambda v: _is_int(v) and v >= 1, "a positive integer") for field in fields}
    if prompt_tokens == 0:
        raise RequestError(400, what, f"{what}: empty (allowed: at least one token)")
    context = getattr(model.config, "max_position_embeddings", None)
    if not isinstance(context, int) or context < 1:
        return
    if prompt_tokens >= context:
        raise RequestError(
            400,
            what,
            f"{what}: {prompt_tokens} tokens, the model's context is {context} tokens (room for none to generate)",
            "context_length_exceeded",
        )
    field, limit = next(((f, v) for f, v in limits.items() if v is not None), (fields[-1], None))
    if limit is None:
        body[fields[-1]] = context - prompt_tokens  # transformers' default (1024) would run past the positions
    elif prompt_tokens + limit > context:
        raise RequestError(
            400,
            field,
            f"{field}: {limit} new tokens after a {prompt_tokens}-token prompt exceed the model's context of "
            f"{context} tokens (allowed: at most {context - prompt_tokens})",
            "context_length_exceeded",
        )


def _tokenizer(processor):
    return getattr(processor, "tokenizer", processor)


def _chat_template_missing(processor) -> bool:
    return not getattr(_tokenizer(processor), "chat_template", None) and not getattr(processor, "chat_template", None)


NO_CHAT_TEMPLATE = (
    "{name} has no chat template (no chat_template.jinja, no `chat_template` in tokenizer_config.json): "
    "/v1/chat/completions and /v1/responses cannot format messages; use /v1/completions, or save a tokenizer "
    "with a chat template into the folder"
)


def _install() -> None:
    """Swap transformers' model manager and handlers for the subclasses below (this process only)."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.cli.serving import chat_completion, completion, model_manager, response
    from transformers.cli.serving.utils import split_revision

    # The classes as transformers defines them (`_install` may run again: the module attributes are swapped below).
    swapped = {
        model_manager: "ModelManager",
        completion: "CompletionHandler",
        chat_completion: "ChatCompletionHandler",
        response: "ResponseHandler",
    }
    original = {name: getattr(module, name) for module, name in swapped.items()}
    original = {name: getattr(cls, "_aot_original", cls) for name, cls in original.items()}

    class AoTModelManager(original["ModelManager"]):
        """transformers' `ModelManager`, loading through `AutoModelForCausalLM` when the architecture is not a
        transformers class (a remote-code model), and refusing a k-NN model under continuous batching."""

        def __init__(self, *args, continuous_batching: bool = False, force_model: str | None = None, **kwargs):
            if force_model is not None and continuous_batching:
                model_id, revision = split_revision(force_model)
                config = AutoConfig.from_pretrained(
                    model_id, revision=revision, trust_remote_code=kwargs.get("trust_remote_code", False)
                )
                if getattr(config, "knn_k", None) is not None:
                    raise UsageError(
                        f"{force_model} is a k-NN model (knn_k={config.knn_k}) and transformers' paged kernels "
                        "attend to every key; serve it without --continuous-batching",
                        argument="--continuous-batching",
                    )
            super().__init__(*args, continuous_batching=continuous_batching, force_model=force_model, **kwargs)
            if force_model is not None:
                self._announce(force_model)

        def _announce(self, name: str) -> None:
            timed = next(iter(self.loaded_models.values()))
            module = type(timed.model).__module__
            code = (
                "the folder's own code (--trust-remote-code)" if module.startswith("transformers_modules") else module
            )
            print(f"aot serve: {name}: {type(timed.model).__name__} from {code}", file=sys.stderr)
            if _chat_template_missing(timed.processor):
                print(f"aot serve: note: {NO_CHAT_TEMPLATE.format(name=name)}", file=sys.stderr)

        def _load_model(self, model_id_and_revision, tqdm_class=None, progress_callback=None, gguf_file=None):
            model_id, revision = split_revision(model_id_and_revision)
            if gguf_file is None:
                config = AutoConfig.from_pretrained(
                    model_id, revision=revision, trust_remote_code=self.trust_remote_code
                )
                architecture = (getattr(config, "architectures", None) or [None])[0]
                if architecture is None or not hasattr(transformers, architecture):
                    quantization = self.get_quantization_config()
                    return AutoModelForCausalLM.from_pretrained(
                        model_id,
                        revision=revision,
                        attn_implementation=self.attn_implementation,
                        dtype=self.dtype,
                        device_map=self.device,
                        trust_remote_code=self.trust_remote_code,
                        tqdm_class=tqdm_class,
                        **({"quantization_config": quantization} if quantization is not None else {}),
                    )
            progress = {"tqdm_class": tqdm_class, "progress_callback": progress_callback}
            return super()._load_model(model_id_and_revision, gguf_file=gguf_file, **progress)

    def served_model(handler) -> tuple[str, Any, Any]:
        manager = handler.model_manager
        served = manager.force_model
        model, processor = manager.load_model_and_processor(manager.process_model_name(served))
        return served, model, processor

    def chat_prompt_tokens(handler, processor, messages, body) -> int:
        kwargs = {**handler.chat_template_kwargs, **(body.get("chat_template_kwargs") or {})}
        ids = _tokenizer(processor).apply_chat_template(
            handler.get_processor_inputs_from_messages(messages, model_manager.Modality.LLM),
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
            tools=body.get("tools"),
            **kwargs,
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids[0]) if ids and isinstance(ids[0], list) else len(ids)

    def check_completion(handler, body: dict, model, processor, served: str) -> None:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise RequestError(400, "prompt", f"prompt: {prompt!r} is not allowed (allowed: a non-empty string)")
        tokens = len(_tokenizer(processor)(prompt)["input_ids"])
        fit_to_context(body, ("max_tokens",), tokens, model, "prompt")

    def check_chat(handler, body: dict, model, processor, served: str) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "messages", f"messages: {messages!r} is not allowed (allowed: a non-empty list)")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise RequestError(
                    400, f"messages[{index}]", f"messages[{index}]: a message needs a `role` and a `content`"
                )
        if not isinstance(body.get("chat_template_kwargs") or {}, dict):
            raise RequestError(400, "chat_template_kwargs", "chat_template_kwargs: not a JSON object")
        if _chat_template_missing(processor):
            raise RequestError(400, "messages", NO_CHAT_TEMPLATE.format(name=served), "no_chat_template")
        tokens = chat_prompt_tokens(handler, processor, body["messages"], body)
        # transformers reads `max_completion_tokens` first, then `max_tokens`: both are checked
        fit_to_context(body, ("max_completion_tokens", "max_tokens"), tokens, model, "messages")

    def check_response(handler, body: dict, model, processor, served: str) -> None:
        if body.get("input") in (None, "", []):
            raise RequestError(400, "input", f"input: {body.get('input')!r} is not allowed (allowed: text)")
        if _chat_template_missing(processor):
            raise RequestError(400, "input", NO_CHAT_TEMPLATE.format(name=served), "no_chat_template")
        messages = handler._normalize_input(dict(body))
        tokens = chat_prompt_tokens(handler, processor, messages, {**body, "tools": None})
        fit_to_context(body, ("max_output_tokens",), tokens, model, "input")

    def guarded(name: str, check):
        """transformers' handler `name`, whose requests pass `check_common_fields` and `check` first."""
        parent = original[name]

        async def handle_request(self, body: dict, request_id: str):
            if self.model_manager.force_model is not None:  # else not started by `aot serve`: transformers' behaviour
                try:
                    served, model, processor = served_model(self)
                    check_common_fields(body, served)
                    check(self, body, model, processor, served)
                except RequestError as error:
                    return error.response()
            return await parent.handle_request(self, body, request_id)

        return type(f"AoT{name}", (parent,), {"handle_request": handle_request})

    class AoTChatCompletionHandler(guarded("ChatCompletionHandler", check_chat)):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            manager = self.model_manager
            if manager.force_model is not None and self.chat_template_kwargs:
                _, _, processor = served_model(self)
                if _chat_template_missing(processor):
                    raise UsageError(NO_CHAT_TEMPLATE.format(name=manager.force_model), argument="chat options")

    replacements = {
        "ModelManager": AoTModelManager,
        "CompletionHandler": guarded("CompletionHandler", check_completion),
        "ChatCompletionHandler": AoTChatCompletionHandler,
        "ResponseHandler": guarded("ResponseHandler", check_response),
    }
    for module, name in swapped.items():
        replacements[name]._aot_original = original[name]
        setattr(module, name, replacements[name])


def serve(model: str, options: list[str]) -> int:
    """Run `transformers serve MODEL OPTIONS...` with the boundary of this module; returns when the server stops."""
    from transformers.utils.import_utils import is_serve_available

    if not is_serve_available():
        raise UsageError(
            "transformers' server needs fastapi, uvicorn, pydantic and openai: "
            "pip install 'aot-transformers[serve]' (or 'transformers[serving]')"
        )
    import typer
    from transformers.cli.serve import Serve

    try:  # recent typer carries its own copy of click
        from typer._click.exceptions import ClickException
    except ImportError:
        from click import ClickException

    _install()
    app = typer.Typer(add_completion=False)
    app.command()(Serve)
    command = typer.main.get_command(app)
    try:
        command.main(args=[model, *options], prog_name="aot serve", standalone_mode=False)
    except typer.Exit as done:  # --help
        return done.exit_code
    except ClickException as error:  # a bad option: one line, exit code 2
        raise UsageError(error.format_message()) from None
    except typer.Abort:
        raise KeyboardInterrupt from None
    return 0


def register(subcommands) -> None:
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
