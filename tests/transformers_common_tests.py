"""Fetch and import transformers' own common model tests (`ModelTesterMixin`, `ConfigTester`).

The transformers source distribution on PyPI ships the top-level `tests/*.py` of the transformers repository
(`test_modeling_common.py`, `test_configuration_common.py`, ...) but not the sub-packages they import
(`tests/generation/test_utils.py`, `tests/exporters/test_export.py`, `tests/utils/test_configuration_utils.py`).
This module downloads the sdist of the *installed* transformers version once, verifies its SHA-256 against PyPI,
extracts `tests/` into a user cache directory, and fills each missing import with a small stand-in written here
(see `_STAND_INS`), so that the mixins import unchanged. A later sdist that ships one of those files is used as is.

Cache: `$AOT_TRANSFORMERS_TESTS_CACHE`, else `$XDG_CACHE_HOME/aot-transformers/transformers-tests`, else
`~/.cache/aot-transformers/transformers-tests`; one folder per transformers version.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path
from types import ModuleType

import transformers

PACKAGE_NAME = "hf_transformers_common_tests"  # the import name of the extracted `tests/` folder
# The JSON form of the simple index (PEP 691), the API pip itself uses.
PYPI_SIMPLE = "https://pypi.org/simple/transformers/"
TIMEOUT_SECONDS = 30

# Modules that `test_modeling_common.py` / `test_configuration_common.py` import but the sdist does not ship.
# The stand-ins keep the names importable; the tests they would add are not run (the conformance module says so).
STAND_IN_MARKER = "AOT_STAND_IN = True"
_STAND_INS = {
    "exporters/test_export.py": f'''"""Stand-in: tests/exporters/test_export.py is not in the transformers sdist."""

{STAND_IN_MARKER}


class ExportTesterMixin:
    """Empty: transformers' export tests are not shipped on PyPI."""
''',
    "generation/test_utils.py": f'''"""Stand-in: tests/generation/test_utils.py is not in the transformers sdist."""

{STAND_IN_MARKER}


class GenerationTesterMixin:
    """Empty: transformers' generation tests are not shipped on PyPI."""
''',
    # Non-default values of the common `PreTrainedConfig` arguments, for `ConfigTester.check_config_arguments_init`.
    "utils/test_configuration_utils.py": f'''"""Stand-in: this file is not in the transformers sdist."""

{STAND_IN_MARKER}

config_common_kwargs = {{
    "return_dict": False,
    "output_hidden_states": True,
    "output_attentions": True,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "architectures": ["AoTModel"],
    "id2label": {{0: "label"}},
    "label2id": {{"label": "0"}},
    "problem_type": "regression",
}}
''',
}


class CommonTestsUnavailable(RuntimeError):
    """The common tests could not be fetched (offline, PyPI unreachable, no sdist for this version)."""


def cache_root() -> Path:
    """The folder that holds one extracted `tests/` per transformers version."""
    if os.environ.get("AOT_TRANSFORMERS_TESTS_CACHE"):
        return Path(os.environ["AOT_TRANSFORMERS_TESTS_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "aot-transformers" / "transformers-tests"


def _sdist_url(version: str) -> tuple[str, str]:
    """The sdist URL and SHA-256 of `transformers==version`, from PyPI's simple index."""
    request = urllib.request.Request(PYPI_SIMPLE, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            index = json.load(response)
    except OSError as error:  # URLError, timeouts and connection errors are all OSErrors
        raise CommonTestsUnavailable(f"PyPI is not reachable ({error})") from error
    filename = f"transformers-{version}.tar.gz"
    for file in index.get("files", []):
        if file.get("filename") == filename:
            return file["url"], file["hashes"]["sha256"]
    raise CommonTestsUnavailable(f"PyPI has no source distribution {filename}")


def _download(url: str, sha256: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:
            data = response.read()
    except OSError as error:
        raise CommonTestsUnavailable(f"downloading {url} failed ({error})") from error
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise CommonTestsUnavailable(f"{url} has SHA-256 {digest}, PyPI lists {sha256}")
    return data


def _extract_tests(data: bytes, version: str, target: Path) -> None:
    """Extract the sdist's `tests/` into `target`, add stand-ins for missing imports, as one atomic rename."""
    prefix = f"transformers-{version}/tests/"
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=target.parent))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            members = [m for m in archive.getmembers() if m.name.startswith(prefix) and m.isfile()]
            if not any(m.name == prefix + "test_modeling_common.py" for m in members):
                raise CommonTestsUnavailable(f"the transformers {version} sdist has no tests/test_modeling_common.py")
            for member in members:
                relative = Path(member.name[len(prefix) :])
                if relative.is_absolute() or ".." in relative.parts:
                    continue  # never write outside the cache folder
                destination = staging / "tests" / relative
                destination.parent.mkdir(parents=True, exist_ok=True)
                destination.write_bytes(archive.extractfile(member).read())
        tests = staging / "tests"
        for relative, source in _STAND_INS.items():
            path = tests / relative
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(source)
        for folder in [tests, *(p for p in tests.rglob("*") if p.is_dir())]:
            (folder / "__init__.py").touch()  # relative imports need packages
        try:
            staging.rename(target)
        except OSError:
            if not (target / "tests" / "test_modeling_common.py").exists():  # else another process won the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def ensure_common_tests(version: str = transformers.__version__) -> Path:
    """The extracted `tests/` folder of `transformers==version`, downloading the sdist on first use."""
    target = cache_root() / version
    tests = target / "tests"
    if not (tests / "test_modeling_common.py").exists():
        url, sha256 = _sdist_url(version)
        _extract_tests(_download(url, sha256), version, target)
    return tests


@functools.cache
def load_common_tests() -> dict[str, ModuleType]:
    """Import the common test modules of the installed transformers as the package `PACKAGE_NAME`.

    Returns:
        `{"modeling": test_modeling_common, "configuration": test_configuration_common,
        "generation": generation.test_utils}`.

    Raises:
        CommonTestsUnavailable: When the sdist cannot be fetched.
    """
    tests = ensure_common_tests()
    if PACKAGE_NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            PACKAGE_NAME, tests / "__init__.py", submodule_search_locations=[str(tests)]
        )
        package = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE_NAME] = package
        spec.loader.exec_module(package)
    names = {
        "modeling": "test_modeling_common",
        "configuration": "test_configuration_common",
        "generation": "generation.test_utils",
    }
    return {key: importlib.import_module(f"{PACKAGE_NAME}.{name}") for key, name in names.items()}


def is_stand_in(module: ModuleType) -> bool:
    """Whether `module` is one of this file's stand-ins rather than transformers' own file."""
    return bool(getattr(module, "AOT_STAND_IN", False))
