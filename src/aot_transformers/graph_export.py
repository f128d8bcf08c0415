"""Export AoT models as graphs: `torch.export` programs and ONNX files with a dynamic batch and sequence length.

`export_program(model)` gives a `torch.export.ExportedProgram` of the logits, `export_onnx(model, path)` an ONNX file
(through `torch.onnx.export(..., dynamo=True)`) checked against onnxruntime, and `aot export onnx FOLDER OUT` does the
latter for a saved model folder. Text models take `input_ids` and `attention_mask` (batch, sequence) and return
next-token logits (batch, sequence, vocab); image classifiers take `pixel_values` (batch, channels, size, size) and
return class logits (batch, labels). The graphs are float32 inference graphs (`eval()`, no dropout, no cache).

The models need no export-specific code: under `torch.export` transformers' `create_causal_mask` always materialises
the causal mask (it never hands SDPA an `is_causal` flag that would bake the example's length into the graph), so one
graph serves every length up to `max_position_embeddings`. The ONNX dependencies are the optional extra `onnx`
(`pip install "aot-transformers[onnx]"`).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from ._io import adapter_of, load_json, load_pretrained, remove_stale_temporaries, temporary_prefix
from .configuration_aot import AoTConfig
from .errors import run_command
from .modeling_aot import AoTForCausalLM, AoTForImageClassification, AoTModel, AoTPreTrainedModel

# What a saved folder's `architectures[0]` must be for `aot export onnx`, and the class that loads it.
EXPORTABLE_ARCHITECTURES = {"AoTForCausalLM": AoTForCausalLM, "AoTForImageClassification": AoTForImageClassification}
# onnxruntime against PyTorch, float32 logits: the tolerance the exported file is checked to.
ONNX_TOLERANCE = 1e-4
ONNX_EXTRA_HINT = 'pip install "aot-transformers[onnx]"'
# The opsets `--opset` accepts: from the one torch's exporter has implementations for (lower ones need a conversion
# that falls back to it with a traceback) to the highest torch declares; the file is checked to carry the one asked.
ONNX_OPSETS = (18, 23)


class GraphExportError(ValueError):
    """A model or folder that cannot be exported, with the reason in one line."""


class CausalLMLogits(nn.Module):
    """The logits of a text model as a pure function of `input_ids` and `attention_mask` (no cache, tensor out).

    `AoTModel` (no LM head) gives its last hidden state instead of logits.
    """

    def __init__(self, model: AoTForCausalLM | AoTModel):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=True)
        return outputs.logits if isinstance(self.model, AoTForCausalLM) else outputs.last_hidden_state


class ImageClassifierLogits(nn.Module):
    """The class logits of `AoTForImageClassification` as a pure function of `pixel_values`."""

    def __init__(self, model: AoTForImageClassification):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, return_dict=True).logits


@dataclass
class ExportSpec:
    """What is exported: the logits-only module, example inputs (by name) and their dynamic dimensions."""

    module: nn.Module
    example_inputs: dict[str, torch.Tensor]
    dynamic_shapes: dict[str, dict[int, torch.export.Dim]]
    output_name: str


def export_spec(model: AoTPreTrainedModel, batch_size: int = 2, sequence_length: int = 8) -> ExportSpec:
    """The module, example inputs and dynamic shapes to export `model` with.

    Args:
        model: `AoTForCausalLM`, `AoTModel` or `AoTForImageClassification`.
        batch_size: Batch of the example inputs (at least 2: torch.export specialises dimensions of size 0 or 1).
        sequence_length: Tokens of the text example (at least 2, at most `max_position_embeddings`).

    Returns:
        An `ExportSpec`. The batch is dynamic (no upper bound); the sequence length of text models is dynamic up to
        `config.max_position_embeddings`. Images keep the model's `image_size`.
    """
    if not isinstance(model, (AoTForCausalLM, AoTModel, AoTForImageClassification)):
        raise GraphExportError(
            "Only AoTForCausalLM, AoTModel and AoTForImageClassification export to a graph, got "
            f"{type(model).__name__}."
        )
    if batch_size < 2:
        raise GraphExportError(
            f"`batch_size` of the example must be at least 2 (else it is baked in), got {batch_size}."
        )
    config = model.config
    parameter = next(model.parameters())
    generator = torch.Generator().manual_seed(0)  # the example's values do not matter; leave the global RNG alone
    batch = torch.export.Dim("batch")
    if isinstance(model, AoTForImageClassification):
        size = config.image_size
        pixel_values = torch.randn(batch_size, config.num_channels, size, size, generator=generator)
        return ExportSpec(
            module=ImageClassifierLogits(model).eval(),
            example_inputs={"pixel_values": pixel_values.to(parameter.device, parameter.dtype)},
            dynamic_shapes={"pixel_values": {0: batch}},
            output_name="logits",
        )
    limit = config.max_position_embeddings
    if not 2 <= sequence_length <= limit:
        raise GraphExportError(
            f"`sequence_length` of the example must lie in [2, max_position_embeddings={limit}], got "
            f"{sequence_length}."
        )
    sequence = torch.export.Dim("sequence", max=limit)
    example = _text_inputs(config, batch_size, sequence_length, generator, padded_row=0)  # a mask not all ones
    return ExportSpec(
        module=CausalLMLogits(model).eval(),
        example_inputs={name: tensor.to(parameter.device) for name, tensor in example.items()},
        dynamic_shapes={"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: sequence}},
        output_name="logits" if isinstance(model, AoTForCausalLM) else "last_hidden_state",
    )


def _text_inputs(config: AoTConfig, batch: int, length: int, generator: torch.Generator, padded_row: int) -> dict:
    """Random `input_ids` (batch, length) and an `attention_mask` that left-pads half of row `padded_row`, if any."""
    input_ids = torch.randint(0, config.vocab_size, (batch, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[padded_row : padded_row + 1, : length // 2] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _knn_failure(model: AoTPreTrainedModel, detail: str) -> GraphExportError:
    return GraphExportError(
        f"This model uses k-NN attention (knn_k={model.config.knn_k!r}) and its export failed; export a dense model "
        f"(knn_k=None) or report the failure. Exporter: {detail}"
    )


def export_program(
    model: AoTPreTrainedModel, batch_size: int = 2, sequence_length: int = 8
) -> torch.export.ExportedProgram:
    """`torch.export` the logits of `model` (inputs and outputs as in the module docstring; `AoTModel`: its last
    hidden state) with a dynamic batch and, for text models, sequence length: an inference graph, `model` in eval
    mode. Raises `GraphExportError` for a model that is not exportable (k-NN models until the k-NN kernel exports)."""
    return _export(export_spec(model, batch_size, sequence_length), model)


def _export(spec: ExportSpec, model: AoTPreTrainedModel) -> torch.export.ExportedProgram:
    try:  # `spec.module` (and so `model`) is in eval mode: `export_spec` made it so
        with torch.no_grad():
            return torch.export.export(
                spec.module, (), spec.example_inputs, dynamic_shapes=spec.dynamic_shapes, strict=False
            )
    except Exception as error:
        if model.config.knn_k is not None:
            raise _knn_failure(model, _first_line(error)) from error
        raise


def _import_onnx() -> ModuleType:
    try:
        import onnx  # noqa: F401
        import onnxruntime
        import onnxscript  # noqa: F401  (torch's dynamo exporter translates through it)
    except ImportError as error:
        raise GraphExportError(
            f"ONNX export needs onnx, onnxscript and onnxruntime ({error.name} is missing): {ONNX_EXTRA_HINT}."
        ) from error
    return onnxruntime


@dataclass
class OnnxExportReport:
    """What `export_onnx` wrote and how closely onnxruntime reproduced PyTorch."""

    path: Path
    files: list[Path]
    input_names: list[str]
    output_name: str
    max_abs_diff: float | None  # over the checked inputs (real tokens only); None when not checked
    checked_shapes: list[tuple[int, ...]]

    def lines(self) -> list[str]:
        size = sum(f.stat().st_size for f in self.files) / 2**20
        lines = [f"Wrote {', '.join(str(f) for f in self.files)} ({size:.1f} MiB)"]
        lines.append(f"inputs: {', '.join(self.input_names)}; output: {self.output_name}")
        if self.max_abs_diff is not None:
            shapes = " and ".join(" x ".join(map(str, s)) for s in self.checked_shapes)
            lines.append(
                f"onnxruntime matches PyTorch: max |difference| {self.max_abs_diff:.2e} (tolerance "
                f"{ONNX_TOLERANCE:g}) on inputs of shape {shapes}"
            )
        return lines


def _check_inputs(spec: ExportSpec, model: AoTPreTrainedModel) -> list[dict[str, torch.Tensor]]:
    """Two inputs whose batch (and length) differ from the example's, to run through both runtimes."""
    generator = torch.Generator().manual_seed(0)
    config = model.config
    if "pixel_values" in spec.example_inputs:
        size = (config.num_channels, config.image_size, config.image_size)
        return [{"pixel_values": torch.randn(batch, *size, generator=generator)} for batch in (1, 3)]
    shapes = ((3, min(5, config.max_position_embeddings)), (1, min(13, config.max_position_embeddings)))
    return [_text_inputs(config, batch, length, generator, padded_row=1) for batch, length in shapes]


def _check_written(path: Path, spec: ExportSpec, model: AoTPreTrainedModel, opset_version: int | None) -> None:
    """Refuse a file that is not what was asked, where the exporter gives only a warning or a logged traceback: an
    opset other than `opset_version` (a failed conversion keeps the exporter's own), or dynamic axes that came out
    fixed (the exporter falls back to the example's shapes when the model specialises on them)."""
    import onnx

    written_model = onnx.load(str(path), load_external_data=False)
    written = [entry.version for entry in written_model.opset_import if entry.domain in ("", "ai.onnx")]
    if opset_version is not None and written != [opset_version]:
        raise GraphExportError(
            f"--opset {opset_version}: the exporter could not convert the model to it (it wrote opset "
            f"{written[0] if written else '?'}); nothing was exported. Leave --opset out for the exporter's default."
        )
    fixed = []
    for graph_input in written_model.graph.input:
        dims = graph_input.type.tensor_type.shape.dim
        for axis in spec.dynamic_shapes.get(graph_input.name, {}):
            if not dims[axis].dim_param:
                fixed.append(f"{graph_input.name}[{axis}] = {dims[axis].dim_value}")
    if fixed:
        message = f"the exported graph fixed dynamic axes to the example's sizes ({', '.join(fixed)})"
        if model.config.knn_k is not None:
            raise _knn_failure(model, message)
        raise GraphExportError(f"The model cannot be exported with a dynamic batch and sequence length: {message}.")


def check_opset(opset_version: int | None) -> None:
    """Refuse an opset outside `ONNX_OPSETS` before any conversion (None: the exporter's default)."""
    low, high = ONNX_OPSETS
    if opset_version is not None and (
        isinstance(opset_version, bool) or not isinstance(opset_version, int) or not low <= opset_version <= high
    ):
        raise GraphExportError(
            f"--opset {opset_version!r}: not an opset this exporter writes (allowed: an integer in [{low}, {high}])."
        )


def _real(outputs: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The outputs at real tokens: padding positions attend to no key; their outputs are never read and runtimes
    fill them differently."""
    return outputs[inputs["attention_mask"].bool()] if "attention_mask" in inputs else outputs


def _check_finite(model: AoTPreTrainedModel, spec: ExportSpec) -> None:
    """Refuse, before anything is converted, a model whose weights or outputs (on the example) are NaN or infinite:
    its file would run and give NaN, and no comparison with PyTorch can fail on NaN = NaN."""
    from .hub import check_finite_weights

    check_finite_weights(
        model, lambda bad: GraphExportError(f"The model's weights are not finite ({bad}): nothing was exported.")
    )
    with torch.no_grad():
        outputs = _real(spec.module(**spec.example_inputs), spec.example_inputs)
    if not torch.isfinite(outputs).all():
        raise GraphExportError(
            f"The model's {spec.output_name} are not finite (NaN or inf) on the example input: nothing was exported."
        )


def _compare_with_onnxruntime(
    path: Path, spec: ExportSpec, model: AoTPreTrainedModel, onnxruntime: ModuleType
) -> float:
    """The largest |onnxruntime - PyTorch| over the check inputs; a NaN or infinite output on either side, or a
    difference over `ONNX_TOLERANCE`, fails (compared input by input: `max(0.0, nan)` would hide a NaN)."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    worst = 0.0
    device = next(model.parameters()).device
    for inputs in _check_inputs(spec, model):
        with torch.no_grad():
            expected = spec.module(**{name: tensor.to(device) for name, tensor in inputs.items()}).float().cpu()
        (actual,) = session.run(None, {name: tensor.numpy() for name, tensor in inputs.items()})
        expected, actual = _real(expected, inputs), _real(torch.from_numpy(actual), inputs)
        if not (torch.isfinite(expected).all() and torch.isfinite(actual).all()):
            raise GraphExportError(
                f"The ONNX file {path.name} or the model gives non-finite {spec.output_name} (NaN or inf): nothing "
                "was exported."
            )
        difference = float((actual - expected).abs().max()) if expected.numel() else 0.0
        if math.isnan(difference) or not difference <= ONNX_TOLERANCE:
            raise GraphExportError(
                f"The ONNX file {path.name} does not reproduce PyTorch: max |difference| {difference:.2e} > "
                f"{ONNX_TOLERANCE:g}; nothing was exported."
            )
        worst = max(worst, difference)
    return worst


def export_onnx(
    model: AoTPreTrainedModel, path: str | os.PathLike, check: bool = True, opset_version: int | None = None
) -> OnnxExportReport:
    """Export `model` to an ONNX file with a dynamic batch (and sequence length) through the dynamo exporter.

    The file is written atomically: a failed export leaves an existing file at `path` untouched. Weights go inside the
    file unless it would pass ONNX's 2 GB limit; then they go to `<name>.data` beside it (listed in the report).

    Args:
        model: `AoTForCausalLM` (inputs `input_ids`, `attention_mask`; output `logits`), `AoTModel` (output
            `last_hidden_state`) or `AoTForImageClassification` (input `pixel_values`; output `logits`).
        path: The .onnx file to write.
        check: Run the file with onnxruntime on two inputs of other shapes than the example and compare with PyTorch
            (within `ONNX_TOLERANCE`, on real tokens).
        opset_version: ONNX opset in `ONNX_OPSETS` (default: the exporter's); the file is checked to carry it.

    Raises:
        GraphExportError: Missing ONNX packages, an opset outside `ONNX_OPSETS`, a model that is not exportable or
            whose weights or outputs are not finite, or a file that does not match; nothing is written then.
    """
    onnxruntime = _import_onnx()
    path = Path(path)
    if path.suffix != ".onnx":
        raise GraphExportError(f"The output file must end in .onnx, got {path}.")
    if path.is_dir():
        raise GraphExportError(f"The output {path} is a folder; give the .onnx file to write.")
    check_opset(opset_version)
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        raise GraphExportError(f"Export a float32 model (its parameters are {dtype}): call `model.float()` first.")
    spec = export_spec(model)
    _check_finite(model, spec)
    # torch.export first, so that a model that specialises on the shapes fails here with a clear error: given the
    # module itself, the ONNX exporter would fall back to other tracers and fix the axes to the example's sizes.
    exported = _export(spec, model)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)  # the staging folder of an export that was killed
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=temporary_prefix(path)) as staging:
        staged = Path(staging) / path.name
        program = torch.onnx.export(
            exported,
            input_names=list(spec.example_inputs),
            output_names=[spec.output_name],
            opset_version=opset_version,
            dynamo=True,
            verbose=False,
        )
        program.save(staged)
        _check_written(staged, spec, model, opset_version)
        max_abs_diff = _compare_with_onnxruntime(staged, spec, model, onnxruntime) if check else None
        files = []
        # External data first, the .onnx file last: a failure part way never leaves a new .onnx beside old data.
        for written in sorted(Path(staging).iterdir(), key=lambda p: (p.name == path.name, p.name)):
            target = path.parent / written.name
            os.replace(written, target)
            files.append(target)
    return OnnxExportReport(
        path=path,
        files=sorted(files),
        input_names=list(spec.example_inputs),
        output_name=spec.output_name,
        max_abs_diff=max_abs_diff,
        checked_shapes=[tuple(next(iter(i.values())).shape) for i in _check_inputs(spec, model)] if check else [],
    )


def load_exportable(folder: str | os.PathLike) -> AoTPreTrainedModel:
    """Load a saved AoT causal LM or image classifier for export (float32, eval mode), with clear errors otherwise."""
    folder = Path(folder)
    if not folder.is_dir():
        raise GraphExportError(f"No such model folder: {folder}.")
    config_file = folder / "config.json"
    if adapter := adapter_of(folder):
        raise GraphExportError(adapter)
    if not config_file.is_file():
        raise GraphExportError(f"{folder} has no config.json: it is not a saved model folder.")
    config = load_json(config_file)  # UsageError (one line, exit code 2) when it is not JSON
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type != "aot":
        raise GraphExportError(
            f"{folder} is not an AoT model folder (config.json has model_type={model_type!r}, expected 'aot')."
        )
    architecture = (config.get("architectures") or [None])[0]
    if architecture not in EXPORTABLE_ARCHITECTURES:
        raise GraphExportError(
            f"{folder} holds a {architecture or 'model without architectures'}; ONNX export takes "
            f"{' or '.join(EXPORTABLE_ARCHITECTURES)} folders."
        )
    try:
        model, info = load_pretrained(
            EXPORTABLE_ARCHITECTURES[architecture], folder, dtype=torch.float32, output_loading_info=True
        )
    except (OSError, ValueError) as error:
        raise GraphExportError(f"Cannot load {folder}: {_first_line(error)}") from error
    if info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        raise GraphExportError(f"{folder} lacks weights of its {architecture}: {', '.join(missing[:5])}.")
    return model.eval()


def _export_onnx_command(args: argparse.Namespace) -> int:
    import logging

    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # the command prints its own report
    # The exporter logs a warning per torchvision operator it cannot register when torchvision is absent.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)

    def export() -> None:
        check_opset(args.opset)  # before anything is loaded or converted
        _import_onnx()  # before loading the model: a missing extra is the most likely error
        model = load_exportable(args.folder)
        print("\n".join(export_onnx(model, args.out, check=not args.no_check, opset_version=args.opset).lines()))

    return run_command(export, prog="aot export onnx")  # a GraphExportError: one line, exit code 2


def register(subcommands: argparse._SubParsersAction) -> None:
    """Add `export onnx FOLDER OUT` to the `aot` parser's subcommands."""
    export = subcommands.add_parser("export", help="export a saved model as a graph (ONNX)")
    formats = export.add_subparsers(dest="export_format", required=True, metavar="{onnx}")
    onnx = formats.add_parser(
        "onnx",
        help="a saved causal LM or image classifier folder to an .onnx file (dynamic batch and length)",
        description=(
            "Export a saved AoT causal LM (inputs input_ids, attention_mask; output logits) or image classifier "
            "(input pixel_values; output logits) to ONNX with a dynamic batch and sequence length, and check the file "
            f"against PyTorch with onnxruntime. Needs {ONNX_EXTRA_HINT}."
        ),
    )
    onnx.add_argument("folder", help="a folder written by save_pretrained / aot train / export_model")
    onnx.add_argument("out", help="the .onnx file to write (weights over 2 GB go to <out>.data beside it)")
    onnx.add_argument(
        "--opset",
        type=int,
        default=None,
        help=f"ONNX opset version, {ONNX_OPSETS[0]} to {ONNX_OPSETS[1]} (default: the exporter's)",
    )
    onnx.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison with PyTorch")
    onnx.set_defaults(func=_export_onnx_command)


__all__ = [
    "CausalLMLogits",
    "ExportSpec",
    "GraphExportError",
    "ImageClassifierLogits",
    "OnnxExportReport",
    "export_onnx",
    "export_program",
    "export_spec",
    "load_exportable",
    "register",
]
