"""The real-scale study (`python -m benchmarks.study`): its plan compares what it says it compares, its FLOP count
agrees with torch's, and the same code, at two steps on tiny shapes, trains runs through `aot train`, writes their
records, skips finished runs, resumes an unfinished one from its committed checkpoint, and renders the report."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from benchmarks.study import plan as study_plan
from benchmarks.study.flops import forward_flops_per_token, matmul_weights
from benchmarks.study.runner import parameter_counts
from transformers import AutoModelForCausalLM

from aot_transformers.training.lm import parse_lm_arguments
from aot_transformers.training.model_setup import build_config
from support import REPO_ROOT, provenance_problems


def build(run: study_plan.Run) -> torch.nn.Module:
    """The model `aot train lm` builds from a run's arguments, on the meta device."""
    model_args = parse_lm_arguments([*run.arguments, "--output_dir", "unused"])[0]
    config = build_config(model_args, "aot-mssa-l-tiny")
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def non_embedding(model: torch.nn.Module) -> int:
    embeddings = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    embeddings |= {id(p) for p in model.get_output_embeddings().parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in embeddings)


def test_each_size_gives_every_architecture_the_same_non_embedding_parameters_and_sizes_span_10x():
    runs = [r for r in study_plan.STUDY.runs() if r.main and r.seed == 0]
    counts: dict[str, dict[str, int]] = {}
    for run in runs:
        counts.setdefault(run.size, {})[run.arch] = non_embedding(build(run))
    for size, by_arch in counts.items():
        low, high = min(by_arch.values()), max(by_arch.values())
        assert high / low < 1.03, (size, by_arch)  # LayerNorms and biases aside, 12d² per GPT-2 layer for all
    sizes = [min(c.values()) for c in counts.values()]
    assert max(sizes) / min(sizes) >= 10
    tokens = {run.size: run.tokens / min(counts[run.size].values()) for run in runs}
    assert max(tokens.values()) / min(tokens.values()) < 1.05  # one tokens-per-parameter ratio across sizes


def test_the_ablations_hold_the_stated_share_of_aot_mssas_weights():
    runs = {r.arch: r for r in study_plan.STUDY.runs() if r.size == "S" and r.seed == 0}
    aot = non_embedding(build(runs["aot-mssa"]))
    assert non_embedding(build(runs["aot-mssa-hybrid"])) / aot == pytest.approx(1.0, abs=0.03)
    assert non_embedding(build(runs["aot-mssa-full"])) / aot == pytest.approx(1.25, abs=0.03)
    gpt2_knn = build(runs["gpt2+knn"])
    assert gpt2_knn.config._attn_implementation == "knn" and gpt2_knn.config.knn_k == study_plan.KNN_K


@pytest.mark.parametrize("arch", ["gpt2", "aot-mssa", "aot-mhsa", "llama"])
def test_forward_flops_match_torchs_count(arch):
    from torch.utils.flop_counter import FlopCounterMode

    study = study_plan.SMOKE
    run = next(r for r in study.runs() if r.arch == arch and r.size == "L")
    model_args = parse_lm_arguments([*run.arguments, "--output_dir", "unused"])[0]
    config = build_config(model_args, "aot-mssa-l-tiny")
    config._attn_implementation = "eager"  # attention as matmuls, which the counter sees
    model = AutoModelForCausalLM.from_config(config).eval()
    tokens = study.block_size
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randint(0, config.vocab_size, (1, tokens)))
    width, layers = config.hidden_size, config.num_hidden_layers
    # The counter sees every query score every key (the causal mask is applied after the product); the study counts
    # the (T + 1) / 2 keys a causal query sees on average. Beside that, both count 2 FLOPs per weight and token.
    full_square = counter.get_total_flops() / tokens
    causal = full_square - layers * 4 * width * tokens + layers * 4 * width * (tokens + 1) / 2
    assert forward_flops_per_token(model, tokens) == pytest.approx(causal, rel=0.02)
    assert matmul_weights(model) >= non_embedding(model)


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory) -> dict[str, Path]:
    """A dataset repository (train / validation / test books) and short PTB and LAMBADA files."""
    import datasets

    from aot_transformers.training.text_data import embedded_corpus

    root = tmp_path_factory.mktemp("study")
    corpus = root / "corpus"
    (corpus / "data").mkdir(parents=True)
    docs = embedded_corpus()
    for split, texts in (("train", docs[:40]), ("validation", docs[40:43]), ("test", docs[43:45])):
        datasets.Dataset.from_dict({"text": texts}).to_parquet(str(corpus / "data" / f"{split}-0.parquet"))
    (root / "eval" / "ptb").mkdir(parents=True)
    (root / "eval" / "lambada").mkdir(parents=True)
    (root / "eval" / "ptb" / "ptb.valid.txt").write_text(" the cat sat on the mat \n a dog ran to the park \n")
    lines = [{"text": "the cat sat on the mat and looked at the dog"}, {"text": "she opened the door to the garden"}]
    (root / "eval" / "lambada" / "lambada_dev100.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    return {"root": root, "corpus": corpus, "eval": root / "eval"}


def study(tiny_study, work: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "benchmarks.study", "--smoke", "--work-dir", str(work)]
    command += ["--corpus", str(tiny_study["corpus"]), "--eval-dir", str(tiny_study["eval"]), *args]
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)


def test_the_study_trains_records_skips_resumes_and_reports(tiny_study):
    work, name = tiny_study["root"] / "work", "S-gpt2+knn-seed0"  # transformers' GPT-2 with the package's k-NN
    done = study(tiny_study, work, "--runs", f"{name},S-llama-seed0", "--jobs", "2")  # two runs at once
    assert done.returncode == 0, done.stderr[-3000:]
    records = work / "records" / "language"
    assert json.loads((records / "S-llama-seed0.json").read_text())["final"]["eval_loss"] > 0
    record = json.loads((records / f"{name}.json").read_text())
    assert record["model_type"] == "gpt2" and record["tokens"] == 2 * 2 * 16
    assert record["command"].startswith("aot train lm --model_type gpt2")
    config = json.loads((work / name / "model" / "config.json").read_text())
    assert config["knn_k"] == study_plan.KNN_K
    assert record["curves"]["eval"] and record["final"]["test_loss"] > 0
    assert record["zero_shot"]["ptb"]["loss"] > 0 and "acc" in record["zero_shot"]["lambada_acc"]
    assert record["flops"] == pytest.approx(record["flops_per_token"] * record["tokens"])
    assert record["parameters"] == parameter_counts(work / name / "model")
    assert not provenance_problems(record) and record["wall_seconds"] > 0
    assert record["host"]["load_1min"]["samples"] >= 1  # the host's load while the run trained
    report = (work / "REPORT.md").read_text()
    assert "| S | GPT-2 + k-NN |" in report and f"{record['final']['eval_loss']:.3f}" in report
    assert "| S | Llama |" in report

    # A finished run is skipped: its record is left as it is.
    before = (records / f"{name}.json").read_bytes()
    again = study(tiny_study, work, "--runs", name)
    assert again.returncode == 0 and (records / f"{name}.json").read_bytes() == before

    # An unfinished run on a new machine: its committed checkpoint comes back and `aot train` resumes from it.
    (records / f"{name}.json").unlink()
    saved = study(tiny_study, work, "--runs", name, "--save-progress")
    assert saved.returncode == 0, saved.stderr[-2000:]
    progress = work / "records" / "progress" / name
    assert json.loads((progress / "trainer_state.json").read_text())["global_step"] == 2
    shutil.rmtree(work / name)
    resumed = study(tiny_study, work, "--runs", name)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "already reached the end of the run (step 2)" in (work / name / "study.log").read_text()
    assert json.loads((records / f"{name}.json").read_text())["final"] == record["final"]


def test_the_jobs_probe_cuts_the_study_command_to_a_few_steps_without_evaluations_or_checkpoints(tmp_path):
    from benchmarks.study import jobs
    from benchmarks.study.runner import Paths, command

    paths = Paths(tmp_path / "text.txt", tmp_path / "tok", tmp_path, tmp_path, tmp_path, tmp_path)
    run = next(r for r in study_plan.STUDY.runs() if r.name == "S-aot-mssa-seed0")
    cut = jobs._arguments(run, paths, 7, tmp_path / "out")
    value = lambda flag: cut[cut.index(flag) + 1]
    assert cut[:2] == ["train", "lm"] and cut.count("--max_steps") == cut.count("--output_dir") == 1
    assert value("--max_steps") == "7" and value("--output_dir") == str(tmp_path / "out")
    assert value("--eval_strategy") == value("--save_strategy") == "no"
    assert not {"--eval_steps", "--save_steps", "--resume_from_checkpoint"} & set(cut)
    full = command(run, paths, study_plan.STUDY)
    kept = ("--config_overrides", "--per_device_train_batch_size", "--block_size", "--learning_rate", "--seed")
    assert all(full[full.index(flag) + 1] == cut[cut.index(flag) + 1] for flag in kept)


def test_the_vision_study_trains_crate_and_records_its_accuracy(tiny_study):
    import io
    import tarfile

    from PIL import Image

    images = tiny_study["root"] / "cifar"
    images.mkdir()
    for label, colour in (("cat", 40), ("dog", 200)):
        with tarfile.open(images / f"train_{label}.tar.gz", "w:gz") as tar:
            for i in range(12):
                buffer = io.BytesIO()
                Image.new("RGB", (32, 32), (colour, i * 9, 255 - colour)).save(buffer, format="JPEG")
                info = tarfile.TarInfo(f"train/{label}/{i:04d}.jpg")
                info.size = buffer.tell()
                buffer.seek(0)
                tar.addfile(info, buffer)
    work, name = tiny_study["root"] / "vision-work", "cifar10-crate-seed0"
    done = study(tiny_study, work, "--only", "vision", "--runs", name, "--images", str(images))
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((work / "records" / "vision" / f"{name}.json").read_text())
    config = json.loads((work / name / "model" / "config.json").read_text())
    assert (config["mlp_type"], config["mlp_layers"]) == ("ista", "all")  # CRATE: MSSA + ISTA in every layer
    assert 0 <= record["final"]["eval_accuracy"] <= 1 and record["curves"]["eval"]
    assert record["command"].startswith("aot train image --preset aot-mssa-v")
    trained = json.loads((work / name / "aot_run.json").read_text())  # the RandAugment the run itself applied
    assert trained["rand_augment"] == f"2,{study_plan.VISION_SMOKE.rand_augment_magnitude}"
    assert record["flops"] > 0 and record["parameters"]["total"] > record["parameters"]["non_embedding"]
    assert "![CIFAR-10 validation accuracy](vision_curves.png)" in (work / "REPORT.md").read_text()
    assert (work / "vision_curves.png").stat().st_size > 0


def test_the_readme_summary_is_rendered_from_the_committed_records():
    from benchmarks.study.report import SUMMARY_END, SUMMARY_START, summary_block
    from benchmarks.study.runner import RECORDS

    readme = (REPO_ROOT / "README.md").read_text()
    shown = SUMMARY_START + readme.split(SUMMARY_START, 1)[1].split(SUMMARY_END, 1)[0] + SUMMARY_END
    assert shown == summary_block(study_plan.STUDY, study_plan.VISION, RECORDS), (
        "README.md's study summary is not the committed records': run `python -m benchmarks.study --only report`"
    )


def test_the_committed_report_is_redrawn_from_the_committed_records(tmp_path):
    from benchmarks.study.report import write_report
    from benchmarks.study.runner import RECORDS

    drawn = write_report(study_plan.STUDY, study_plan.VISION, RECORDS, tmp_path).read_text()
    assert drawn == (REPO_ROOT / "benchmarks" / "study" / "REPORT.md").read_text(), (
        "benchmarks/study/REPORT.md is not the committed records': run `python -m benchmarks.study --only report`"
    )


def test_power_law_fits_an_exact_law_and_needs_two_compute_values():
    from benchmarks.study.report import power_law

    a, b = power_law([(c, 7.0 * c**-0.2) for c in (1e12, 1e13, 1e14)])
    assert math.isclose(a, 7.0, rel_tol=1e-9) and math.isclose(b, 0.2, rel_tol=1e-9)
    assert power_law([(1e12, 5.145), (1e12, 5.160)]) is None  # two seeds of one size: no slope to fit


def test_a_sigterm_stops_the_runs_in_progress_through_their_checkpoints_and_starts_no_other(tiny_study):
    import signal
    import time

    work, names = tiny_study["root"] / "stopped", ["S-gpt2-seed0", "S-llama-seed0", "S-aot-mssa-seed0"]  # plan order
    command = [sys.executable, "-m", "benchmarks.study", "--smoke", "--smoke-steps", "100000", "--work-dir", str(work)]
    command += ["--corpus", str(tiny_study["corpus"]), "--eval-dir", str(tiny_study["eval"])]
    process = subprocess.Popen([*command, "--runs", ",".join(names), "--jobs", "2"], cwd=REPO_ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.time() + 300
    while not all(any((work / name).glob("checkpoint-*")) for name in names[:2]):  # both training, past a checkpoint
        assert process.poll() is None and time.time() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 130, stderr[-3000:]
    assert "stopped by SIGTERM" in stdout
    report = (work / "REPORT.md").read_text()  # redrawn with the checkpoints: where each stopped run stands
    for name in names[:2]:  # each saved the step it was in, and that checkpoint waits for the next session
        step = json.loads((work / "records" / "progress" / name / "trainer_state.json").read_text())["global_step"]
        assert 0 < step < 100000
        assert "interrupted: SIGTERM: stopped at step" in (work / name / "study.log").read_text()
        assert f"`{name}` (at step {step:,} of 100,000" in report
    assert not (work / names[2] / "study.log").exists()  # the third run never started
    assert not (work / "records" / "language").exists()  # and no run has a record


def test_stop_after_ends_the_study_as_a_sigterm_does_when_its_hours_are_up(tiny_study):
    work = tiny_study["root"] / "deadline"
    done = study(tiny_study, work, "--runs", "S-gpt2-seed0,S-llama-seed0", "--stop-after", "0")
    assert done.returncode == 130, done.stderr[-3000:]
    assert "stopped by SIGTERM or --stop-after" in done.stdout
    assert not (work / "records" / "language").exists()  # no run has a record, and the report is not redrawn
    assert not (work / "REPORT.md").exists()


def _record(arch: str, seed: int, final: float, early: float, ptb: float = 8.0, main: bool = True) -> dict:
    """A language record of size S with the fields the report reads."""
    return {
        "run": f"S-{arch}-seed{seed}", "section": "language", "arch": arch, "size": "S", "seed": seed, "main": main,
        "shape": {"num_hidden_layers": 2, "hidden_size": 96, "num_attention_heads": 3},
        "parameters": {"total": 1_000_000, "non_embedding": 221_184}, "tokens": 4_423_680, "steps": 1080,
        "flops": 3e13, "flops_per_token": 7e6, "curves": {"train": [[1, 9.0]], "eval": [[108, early], [1080, final]]},
        "final": {"eval_loss": final, "test_loss": final, "unigram_loss": 6.8, "below_unigram": 6.8 - final},
        "zero_shot": {"ptb": {"loss": ptb}, "lambada": {"loss": 5.8}, "lambada_acc": {"acc": 0.0}},
        "wall_seconds": 1800.0,
    }  # fmt: skip


def test_each_verdict_is_judged_against_the_seed_noise_of_the_number_it_compares(tmp_path):
    from benchmarks.study.report import write_report

    records = tmp_path / "records"
    (records / "language").mkdir(parents=True)
    # Seeds 0.01 apart at the end, 0.2 at the first evaluation, 0.4 on PTB: noises 0.005, 0.1 and 0.2.
    rows = [_record(a, s, 5.0 + 0.01 * s, 6.0 + 0.2 * s, 8.0 + 0.4 * s) for a in ("gpt2", "aot-mssa") for s in (0, 1)]
    rows += [
        _record("aot-mssa+knn", 0, 4.98, 6.0, main=False),  # 0.025 ahead at the end (> 0.01), 0.1 early (< 0.2)
        _record("gpt2+knn", 0, 5.0, 5.7, main=False),  # 0.4 ahead early (> 0.2), level at the end
        _record("aot-mssa-hybrid", 0, 4.9, 5.95, ptb=7.7, main=False),  # early 0.15 (< 0.2); PTB 0.5 (> 0.4)
        _record("aot-mssa-full", 0, 4.9, 5.5, ptb=7.9, main=False),  # early 0.6 (> 0.2); PTB 0.3 (< 0.4)
    ]
    for row in rows:
        (records / "language" / f"{row['run']}.json").write_text(json.dumps(row))
    text = write_report(study_plan.STUDY, study_plan.VISION, records, tmp_path / "report").read_text()
    assert "0.005 nats at the end of a run, 0.100 at its first validation point; zero-shot PTB 0.200" in text
    assert "AoT-MSSA: first evaluation -0.100 (not faster), final -0.025 nats (better)" in text
    assert "GPT-2: first evaluation -0.400 (faster), final -0.005 nats (not better)" in text
    assert "**Verdict: faster early mixed; ends better mixed.**" in text
    assert "AoT-MSSA Hybrid: first evaluation -0.150 (not faster), PTB -0.500" in text and "better on ptb" in text
    assert "AoT-MSSA Full MLP: first evaluation -0.600 (faster), PTB -0.300" in text
    assert "**Verdict: faster mixed; no zero-shot gain mixed.**" in text
    assert "- S: GPT-2 ahead, by 0.000 over AoT-MSSA (0x the noise)." in text
    # Verdicts judged on part of their planned rows say so, naming the rows they wait for.
    waiting = "Provisional until the rest has finished:"
    assert f"(provisional).** {waiting} S AoT-MHSA vs GPT-2 not finished yet; M AoT-MSSA" in text
    assert f"ends better mixed.** {waiting} `cifar10-vit+knn-seed0` not finished yet;" in text


def _image_record(arch: str, seed: int, accuracy: float) -> dict:
    """A CIFAR-10 record with the fields the report's vision section reads."""
    return {
        "run": f"cifar10-{arch}-seed{seed}", "section": "vision", "arch": arch, "seed": seed, "main": True,
        "shape": {"num_hidden_layers": 6, "hidden_size": 192}, "wall_seconds": 3600.0,
        "parameters": {"total": 2_700_000 if arch == "vit" else 900_000, "non_embedding": 2_650_000},
        "final": {"eval_accuracy": accuracy}, "curves": {"eval": [[351, accuracy / 2], [3516, accuracy]]},
    }  # fmt: skip


def test_the_vision_section_names_each_vit_run_short_of_the_floor_and_judges_aot_by_the_papers_gap():
    from benchmarks.study.report import vision_section

    floor = study_plan.VISION.vit_floor
    short = [_image_record("vit", 0, floor / 100 - 0.05), _image_record("vit", 1, floor / 100 + 0.01)]
    text = "\n".join(vision_section([*short, _image_record("aot-mhsa", 0, floor / 100 - 0.03)]))
    assert (
        f"Every ViT run must reach {floor:.0f}% validation accuracy: short of it: `cifar10-vit-seed0` (50.0%)." in text
    )
    assert "AoT-MHSA -1.0 points vs ViT at 0.33x its parameters (held)" in text  # 52% vs the mean of 50% and 56%
    text = "\n".join(vision_section([_image_record("vit", 0, floor / 100 + 0.05)]))
    assert "all finished ViT runs do." in text


def test_a_vision_verdict_on_part_of_its_rows_says_it_is_provisional_and_what_is_missing():
    from benchmarks.study.report import vision_section

    def crate(seed: int) -> dict:  # CRATE's ISTA dictionaries: more weights than AoT-MSSA's 0.9M
        return {**_image_record("crate", seed, 0.68), "parameters": {"total": 1_300_000, "non_embedding": 1_250_000}}

    rows = [_image_record("vit", 0, 0.60), _image_record("vit", 1, 0.60), crate(0)]
    words: dict[str, str] = {}
    text = "\n".join(vision_section([*rows, _image_record("aot-mssa", 0, 0.61)], words))
    waiting = "Provisional until the rest has finished: AoT-MHSA vs ViT not finished yet; "
    assert f"**Verdict: held (provisional).** {waiting}" in text
    assert "CRATE on 1 of 2 seeds; AoT-MSSA on 1 of 2 seeds." in text
    assert words["AoT close to ViT and CRATE"] == "held (provisional)"
    rows += [crate(1), _image_record("aot-mssa", 0, 0.61), _image_record("aot-mssa", 1, 0.61)]
    rows += [_image_record("aot-mhsa", seed, 0.59) for seed in (0, 1)]
    text = "\n".join(vision_section(rows, words))
    assert "**Verdict: held.**" in text and "Provisional" not in text and words["AoT close to ViT and CRATE"] == "held"


def test_the_readme_summary_lists_each_cifar10_main_row_with_its_seeds(tmp_path):
    from benchmarks.study.report import summary_block

    (tmp_path / "vision").mkdir()
    rows = [_image_record("vit", 0, 0.56), _image_record("vit", 1, 0.58), _image_record("crate", 0, 0.62)]
    rows.append({**_image_record("aot-mssa+knn", 0, 0.5), "main": False})  # a k-NN twin: REPORT.md's, not here
    for row in rows:
        (tmp_path / "vision" / f"{row['run']}.json").write_text(json.dumps(row))
    text = summary_block(study_plan.STUDY, study_plan.VISION, tmp_path)
    assert "| ViT (2 seeds) | 2.70M | 57.0 ± 1.0 | 2.00 |" in text and "| CRATE | 0.90M | 62.0 | 1.00 |" in text
    assert "k-NN" not in text.split("CIFAR-10 validation accuracy", 1)[1].split("Verdicts", 1)[0]


def test_a_planned_runs_flops_are_those_its_record_counts():
    from benchmarks.study.flops import planned_flops
    from benchmarks.study.report import load_records
    from benchmarks.study.runner import RECORDS

    planned = {run.name: run for run in study_plan.schedule(study_plan.STUDY, study_plan.VISION)}
    records = load_records(RECORDS) + load_records(RECORDS, "vision")
    assert records, "the committed records"
    for record in records:
        assert planned_flops(planned[record["run"]], study_plan.STUDY.block_size) == pytest.approx(record["flops"])


def test_the_hours_left_follow_the_fastest_rate_of_each_architecture():
    from benchmarks.study.flops import planned_flops
    from benchmarks.study.report import remaining_hours

    runs = {run.name: run for run in study_plan.STUDY.runs()}
    finished = [  # GPT-2 at 1e10 FLOP/s at best; no record of Llama
        {"section": "language", "arch": "gpt2", "flops": 3e13, "wall_seconds": 3e3},
        {"section": "language", "arch": "gpt2", "flops": 3e13, "wall_seconds": 6e3},
    ]
    left = [runs["M-gpt2-seed0"], runs["S-gpt2+knn-seed0"], runs["M-llama-seed0"]]
    hours = remaining_hours(left, finished, study_plan.STUDY.block_size)
    assert hours["M-gpt2-seed0"] == pytest.approx(planned_flops(left[0], study_plan.STUDY.block_size) / 1e10 / 3600)
    assert hours["S-gpt2+knn-seed0"] == pytest.approx(planned_flops(left[1], study_plan.STUDY.block_size) / 3.6e13)
    assert hours["M-llama-seed0"] is None


def test_a_started_runs_hours_left_follow_its_own_pace_and_the_report_says_where_it_stands(tmp_path):
    from benchmarks.study.report import _standing, progress, remaining_hours
    from benchmarks.study.runner import PROGRESS, WALL_FILE

    runs = {run.name: run for run in study_plan.STUDY.runs()}
    started, fresh = runs["M-gpt2-seed0"], runs["M-llama-seed0"]
    folder = tmp_path / PROGRESS / started.name
    folder.mkdir(parents=True)
    history = [{"step": 50, "loss": 7.1}, {"step": 100, "eval_loss": 6.25}, {"step": 200, "eval_loss": 5.5}]
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 240, "log_history": history}))
    (folder / WALL_FILE).write_text(json.dumps({"seconds": 480.0}))  # 2 s a step
    finished = [{"section": "language", "arch": "gpt2", "flops": 3e13, "wall_seconds": 3e3}]
    stands = {run.name: stand for run in (started, fresh) if (stand := progress(run, tmp_path))}
    hours = remaining_hours([started, fresh], finished, study_plan.STUDY.block_size, stands)
    assert hours[started.name] == pytest.approx(2 * (started.steps - 240) / 3600)
    assert hours[fresh.name] is None  # no checkpoint, and no finished Llama to go by
    said = _standing(started, stands[started.name], hours[started.name])
    assert f"at step 240 of {started.steps:,}, validation loss 5.500 at step 200; 0.1 h so far" in said
    assert _standing(fresh, stands.get(fresh.name), None) == f"`{fresh.name}`"


def test_records_written_but_not_committed_are_found_for_the_next_invocation_to_commit(tmp_path):
    from benchmarks.study.runner import uncommitted_records

    records = tmp_path / "records"
    (records / "language").mkdir(parents=True)
    git = lambda *args: subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)
    git("init", "-q")
    (records / "language" / "S-gpt2-seed0.json").write_text("{}")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a record")
    assert uncommitted_records(records) == []
    (records / "language" / "S-llama-seed0.json").write_text("{}")  # written, the study stopped before its commit
    (records / "language" / "S-gpt2-seed0.json").write_text('{"final": {}}')
    assert sorted(p.name for p in uncommitted_records(records)) == ["S-gpt2-seed0.json", "S-llama-seed0.json"]
    assert uncommitted_records(tmp_path / "none") == []


def test_the_jobs_probe_keeps_the_rows_probed_before_each_with_its_date():
    from benchmarks.study.jobs import merged

    before = {"date": "2026-11-29", "probes": {"S-gpt2-seed0": {"pair_speedup": 1.9}, "L-gpt2-seed0": {"x": 1}}}
    now = {"date": "2026-12-02"}
    probes = merged(before, {"L-gpt2-seed0": {"pair_speedup": 1.2}}, now)
    assert probes["S-gpt2-seed0"] == {"pair_speedup": 1.9, "measured": {"date": "2026-11-29"}}
    assert probes["L-gpt2-seed0"] == {"pair_speedup": 1.2, "measured": now}
    assert merged({"date": "d", "probes": probes}, {}, now)["S-gpt2-seed0"]["measured"] == {"date": "2026-11-29"}
