"""The documentation site builds without warnings (Sphinx, -W), so that it cannot rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_docs_build_without_warnings(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            str(ROOT / "docs"),
            str(tmp_path / "html"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    for page in ("index", "getting_started", "api", "reproduction", "gallery", "clipping"):
        assert (tmp_path / "html" / f"{page}.html").exists()
    api = (tmp_path / "html" / "api.html").read_text()
    assert "DPBarker" in api and "MinibatchLLRRelease" in api  # docstrings were rendered
