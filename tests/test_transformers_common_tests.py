"""The helper that fetches transformers' common tests: extraction, stand-ins, checksum, offline error (no network)."""

from __future__ import annotations

import hashlib
import io
import tarfile
from unittest import mock

import pytest

import transformers_common_tests as common


def _sdist(version: str, files: dict[str, str]) -> bytes:
    """An in-memory `transformers-<version>.tar.gz` holding `files` (paths relative to the sdist root)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"transformers-{version}/{path}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_extract_keeps_shipped_files_and_fills_only_missing_imports(tmp_path):
    shipped = "class GenerationTesterMixin:\n    pass\n"
    data = _sdist(
        "9.9.9",
        {
            "tests/test_modeling_common.py": "# common\n",
            "tests/generation/test_utils.py": shipped,
            "src/transformers/__init__.py": "",
        },
    )
    target = tmp_path / "9.9.9"
    common._extract_tests(data, "9.9.9", target)
    tests = target / "tests"
    assert (tests / "generation" / "test_utils.py").read_text() == shipped  # shipped file used as is
    assert common.STAND_IN_MARKER in (tests / "exporters" / "test_export.py").read_text()
    assert common.STAND_IN_MARKER in (tests / "utils" / "test_configuration_utils.py").read_text()
    assert (tests / "__init__.py").exists() and (tests / "exporters" / "__init__.py").exists()
    assert not (target / "src").exists()  # only tests/ is extracted
    assert [p.name for p in tmp_path.iterdir()] == ["9.9.9"]  # no staging folder left behind


def test_extract_refuses_an_sdist_without_the_common_tests(tmp_path):
    data = _sdist("9.9.9", {"tests/test_other.py": ""})
    with pytest.raises(common.CommonTestsUnavailable, match="no tests/test_modeling_common.py"):
        common._extract_tests(data, "9.9.9", tmp_path / "9.9.9")
    assert not (tmp_path / "9.9.9").exists()


def test_download_rejects_a_checksum_mismatch():
    response = mock.MagicMock()
    response.__enter__.return_value.read.return_value = b"tampered"
    with mock.patch("urllib.request.urlopen", return_value=response):
        with pytest.raises(common.CommonTestsUnavailable, match="SHA-256"):
            common._download("https://example.invalid/t.tar.gz", hashlib.sha256(b"original").hexdigest())


def test_offline_raises_common_tests_unavailable(tmp_path, monkeypatch):
    monkeypatch.setenv("AOT_TRANSFORMERS_TESTS_CACHE", str(tmp_path))
    with mock.patch("urllib.request.urlopen", side_effect=OSError("network is unreachable")):
        with pytest.raises(common.CommonTestsUnavailable, match="PyPI is not reachable"):
            common.ensure_common_tests("9.9.9")


def test_cached_version_is_used_without_network(tmp_path, monkeypatch):
    monkeypatch.setenv("AOT_TRANSFORMERS_TESTS_CACHE", str(tmp_path))
    common._extract_tests(_sdist("9.9.9", {"tests/test_modeling_common.py": ""}), "9.9.9", tmp_path / "9.9.9")
    with mock.patch("urllib.request.urlopen", side_effect=AssertionError("no download expected")):
        assert common.ensure_common_tests("9.9.9") == tmp_path / "9.9.9" / "tests"
