"""`aot export onnx FOLDER OUT`: saved folders to ONNX files that onnxruntime runs at any batch and length."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import torch

from aot_transformers import AoTForCausalLM, AoTForImageClassification, AoTModel, graph_export
from aot_transformers.cli import main
from aot_transformers.graph_export import GraphExportError, export_onnx
from support import tiny_config

pytest.importorskip("onnxscript", reason="the ONNX extra is not installed (pip install 'aot-transformers[onnx]')")
onnxruntime = pytest.importorskip("onnxruntime", reason="the ONNX extra is not installed")

TOLERANCE = 1e-4


def _session(path) -> onnxruntime.InferenceSession:
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _text_inputs(batch: int, length: int) -> dict[str, torch.Tensor]:
    input_ids = torch.randint(0, 97, (batch, length))
    attention_mask = torch.ones_like(input_ids)
    if batch > 1:
        attention_mask[-1, : length // 3] = 0  # left padding in the last row
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def _assert_lm_matches(session, model, batch: int, length: int) -> None:
    inputs = _text_inputs(batch, length)
    (logits,) = session.run(["logits"], {name: tensor.numpy() for name, tensor in inputs.items()})
    with torch.no_grad():
        expected = model(**inputs).logits
    real = inputs["attention_mask"].bool()  # padding positions see no key; their outputs are never read
    torch.testing.assert_close(torch.from_numpy(logits)[real], expected[real], atol=TOLERANCE, rtol=TOLERANCE)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["export", "onnx", *map(str, argv)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("aot export onnx: error:")]


def test_cli_exports_a_causal_lm_that_onnxruntime_runs_at_any_batch_and_length(tmp_path, capsys):
    folder = tmp_path / "lm"
    AoTForCausalLM(tiny_config()).save_pretrained(folder)  # MSSA; MHSA is exported below
    out = tmp_path / "onnx" / "lm.onnx"
    status, stdout, err = _run(capsys, folder, out)
    assert status == 0, err
    assert "onnxruntime matches PyTorch" in stdout
    session = _session(out)
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    assert all(isinstance(d, str) for i in session.get_inputs() for d in i.shape)  # batch and sequence are symbolic
    model = AoTForCausalLM.from_pretrained(folder).eval()
    for batch, length in ((1, 7), (4, 30)):
        _assert_lm_matches(session, model, batch, length)


def test_cli_exports_an_image_classifier_with_a_dynamic_batch(tmp_path, capsys):
    folder = tmp_path / "classifier"
    AoTForImageClassification(tiny_config()).save_pretrained(folder)
    out = tmp_path / "classifier.onnx"
    status, stdout, err = _run(capsys, folder, out)
    assert status == 0, err
    session = _session(out)
    assert [i.name for i in session.get_inputs()] == ["pixel_values"]
    model = AoTForImageClassification.from_pretrained(folder).eval()
    for batch in (1, 6):
        pixel_values = torch.randn(batch, 3, 16, 16)
        (logits,) = session.run(["logits"], {"pixel_values": pixel_values.numpy()})
        with torch.no_grad():
            expected = model(pixel_values=pixel_values).logits
        torch.testing.assert_close(torch.from_numpy(logits), expected, atol=TOLERANCE, rtol=TOLERANCE)


def test_export_onnx_of_an_mhsa_backbone_gives_its_hidden_states(tmp_path):
    model = AoTModel(tiny_config(attention_type="mhsa")).eval()
    report = export_onnx(model, tmp_path / "backbone.onnx")
    assert report.output_name == "last_hidden_state" and report.max_abs_diff <= TOLERANCE
    inputs = _text_inputs(2, 9)
    (hidden,) = _session(report.path).run(None, {k: v.numpy() for k, v in inputs.items()})
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(torch.from_numpy(hidden)[real], expected[real], atol=TOLERANCE, rtol=TOLERANCE)


def _not_aot_folder(tmp_path):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    return folder


def _backbone_folder(tmp_path):
    folder = tmp_path / "backbone"
    AoTModel(tiny_config()).save_pretrained(folder)
    return folder


def _empty_folder(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    return folder


@pytest.mark.parametrize(
    "make_folder, message",
    [
        (lambda tmp_path: tmp_path / "missing", "No such model folder"),
        (_empty_folder, "has no config.json"),
        (_not_aot_folder, "not an AoT model folder (config.json has model_type='gpt2'"),
        (_backbone_folder, "holds a AoTModel; ONNX export takes AoTForCausalLM or AoTForImageClassification"),
    ],
    ids=["missing", "no-config", "not-aot", "backbone"],
)
def test_cli_bad_folder_exits_2_with_one_line(tmp_path, capsys, make_folder, message):
    out = tmp_path / "model.onnx"
    status, stdout, err = _run(capsys, make_folder(tmp_path), out)
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not out.exists()


def test_cli_rejects_an_output_that_is_not_an_onnx_file(tmp_path, capsys):
    folder = tmp_path / "lm"
    AoTForCausalLM(tiny_config()).save_pretrained(folder)
    status, _, err = _run(capsys, folder, tmp_path / "model.bin")
    assert status == 2 and "must end in .onnx" in err


def test_cli_without_the_onnx_extra_names_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if not installed
    status, _, err = _run(capsys, tmp_path, tmp_path / "model.onnx")
    assert status == 2
    assert "onnxscript is missing" in err and 'pip install "aot-transformers[onnx]"' in err


def test_export_onnx_asks_for_a_float32_model(tmp_path):
    with pytest.raises(GraphExportError, match=r"float32 model \(its parameters are torch.bfloat16\)"):
        export_onnx(AoTForCausalLM(tiny_config()).to(torch.bfloat16), tmp_path / "lm.onnx")
    assert not any(tmp_path.iterdir())


def test_a_failed_export_leaves_the_existing_file_untouched(tmp_path, monkeypatch):
    out = tmp_path / "lm.onnx"
    out.write_bytes(b"the previous export")

    class InterruptedWrite:
        def save(self, destination):  # half a file, then the disk fills up
            with open(destination, "wb") as handle:
                handle.write(b"half an onnx file")
            raise OSError("No space left on device")

    monkeypatch.setattr(graph_export.torch.onnx, "export", lambda *args, **kwargs: InterruptedWrite())
    with pytest.raises(OSError, match="No space left"):
        export_onnx(AoTForCausalLM(tiny_config()).eval(), out)
    assert out.read_bytes() == b"the previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lm.onnx"]  # no staging folder left behind


def test_the_staging_folder_of_a_killed_export_is_removed_by_the_next_export(tmp_path):
    import socket
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer runs: the writer was killed mid-export (SIGKILL runs no cleanup)
    killed = tmp_path / f".lm.onnx.{socket.gethostname()}-{dead.pid}.x1y2z3"
    killed.mkdir()
    (killed / "lm.onnx").write_bytes(b"half an onnx file")
    export_onnx(AoTForCausalLM(tiny_config()).eval(), tmp_path / "lm.onnx", check=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lm.onnx"]


def test_cli_knn_model_exports_and_matches_onnxruntime(tmp_path, capsys):
    """Under export the k-NN kernel runs in one piece with no Python on the length: the file has dynamic axes."""
    folder = tmp_path / "knn"
    AoTForCausalLM(tiny_config(knn_k=3)).save_pretrained(folder)
    out = tmp_path / "knn.onnx"
    status, _, err = _run(capsys, folder, out)
    assert status == 0, err
    model = AoTForCausalLM.from_pretrained(folder).eval()
    for batch, length in ((1, 7), (3, 12)):
        _assert_lm_matches(_session(out), model, batch, length)


def test_export_onnx_of_a_knn_model_matches_onnxruntime(tmp_path):
    """An MHSA model with a fractional k (the CLI test above has MSSA with an int k)."""
    model = AoTForCausalLM(tiny_config(attention_type="mhsa", knn_k=0.5)).eval()
    report = export_onnx(model, tmp_path / "knn.onnx")
    for batch, length in ((1, 7), (3, 12)):
        _assert_lm_matches(_session(report.path), model, batch, length)


def _readme_export_blocks() -> list[tuple[str, str]]:
    """(language, code) of every code block in the README's "Export (torch.export, ONNX)" subsection."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = re.split(r"\n##+ ", text.split("### Export (torch.export, ONNX)", 1)[1], maxsplit=1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)


def test_readme_export_commands_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    blocks = _readme_export_blocks()
    assert [language for language, _ in blocks] == ["python", "bash", "python"]
    namespace: dict = {}
    exec(blocks[0][1], namespace)  # torch.export at another batch and length than the example's
    assert namespace["logits"].shape == (3, 50, 1024)
    with torch.no_grad():
        expected = namespace["model"](input_ids=namespace["input_ids"]).logits
    torch.testing.assert_close(namespace["logits"], expected, atol=1e-5, rtol=1e-5)
    commands = [line.split("#")[0].strip() for line in blocks[1][1].splitlines()]
    for command in commands:
        if command.startswith("aot "):
            assert main(shlex.split(command)[1:]) == 0, capsys.readouterr().err
        else:
            assert command.startswith("pip install"), command
    exec(blocks[2][1], namespace)  # onnxruntime on the exported file
    logits = torch.from_numpy(namespace["logits"])
    inputs = {k: torch.from_numpy(namespace[k]) for k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        expected = namespace["model"](**inputs).logits
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(logits[real], expected[real], atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.parametrize("poison", ["weights", "outputs"])
def test_a_model_with_non_finite_weights_or_outputs_is_refused_and_nothing_is_written(tmp_path, capsys, poison):
    model = AoTForCausalLM(tiny_config())
    with torch.no_grad():
        if poison == "weights":
            model.model.embed_tokens.weight[3, 0] = float("nan")
        else:  # finite weights whose outputs overflow to inf - inf = NaN
            model.lm_head.weight.fill_(3e38)
    folder = tmp_path / "lm"
    model.save_pretrained(folder)
    out = tmp_path / "lm.onnx"
    status, stdout, err = _run(capsys, folder, out)
    assert status == 2 and len(_error_lines(err)) == 1 and "not finite" in err and "Traceback" not in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["lm"]
    assert "matches PyTorch" not in stdout


def test_the_onnxruntime_comparison_fails_on_nan_outputs(tmp_path, monkeypatch):
    """Python's max(0.0, nan) is 0.0: a NaN graph must fail the comparison, not pass it with difference 0."""
    model = AoTForCausalLM(tiny_config()).eval()

    class NaNSession:
        def __init__(self, *args, **kwargs):
            pass

        def run(self, _names, feeds):
            batch, length = feeds["input_ids"].shape
            return [torch.full((batch, length, model.config.vocab_size), float("nan")).numpy()]

    monkeypatch.setattr(onnxruntime, "InferenceSession", NaNSession)
    out = tmp_path / "lm.onnx"
    with pytest.raises(GraphExportError, match="non-finite"):
        export_onnx(model, out)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("opset", ["1", "16", "999", "-3"])
def test_an_opset_the_exporter_does_not_write_is_one_line_before_any_conversion(tmp_path, capsys, monkeypatch, opset):
    folder = tmp_path / "lm"
    AoTForCausalLM(tiny_config()).save_pretrained(folder)
    monkeypatch.setattr(graph_export, "load_exportable", lambda _folder: pytest.fail("loaded before the check"))
    status, _, err = _run(capsys, folder, tmp_path / "lm.onnx", "--opset", opset)
    assert status == 2 and len(err.strip().splitlines()) == 1 and "--opset" in err and "[18, 23]" in err
    assert not (tmp_path / "lm.onnx").exists()


def test_an_allowed_opset_is_the_one_written(tmp_path, capsys):
    import onnx

    folder = tmp_path / "lm"
    AoTForCausalLM(tiny_config()).save_pretrained(folder)
    status, _, err = _run(capsys, folder, tmp_path / "lm.onnx", "--opset", "21")
    assert status == 0, err
    imports = onnx.load(str(tmp_path / "lm.onnx"), load_external_data=False).opset_import
    assert [entry.version for entry in imports if entry.domain in ("", "ai.onnx")] == [21]
