"""The type stubs of the compiled module are generated from the build (scripts/stubs.sh), never
written by hand: the committed ones must match what pybind11-stubgen makes of this build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dra

STUBS = Path(dra.__file__).with_name("_core")


def test_committed_stubs_match_the_build(tmp_path: Path) -> None:
    stubgen = Path(sys.executable).with_name("pybind11-stubgen")
    proc = subprocess.run([str(stubgen), "dra._core", "-o", str(tmp_path), "--exit-code"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    made = {p.name: p.read_text() for p in (tmp_path / "dra" / "_core").glob("*.pyi")}
    committed = {p.name: p.read_text() for p in STUBS.glob("*.pyi")}
    assert sorted(made) == sorted(committed), "stub files differ: run scripts/stubs.sh"
    stale = [name for name in made if made[name] != committed[name]]
    assert not stale, f"python/dra/_core/{stale} do not match the build: run scripts/stubs.sh"


def test_committed_sim_stub_matches_the_build(tmp_path: Path) -> None:
    stubgen = Path(sys.executable).with_name("pybind11-stubgen")
    proc = subprocess.run([str(stubgen), "dra._sim", "-o", str(tmp_path), "--exit-code"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    made = (tmp_path / "dra" / "_sim.pyi").read_text()
    assert made == STUBS.with_name("_sim.pyi").read_text(), "python/dra/_sim.pyi does not match the build: run scripts/stubs.sh"


def test_stubs_cover_every_public_name() -> None:
    text = (STUBS / "__init__.pyi").read_text()
    for name in dir(dra._core):
        if not name.startswith("_") and name not in ("annotations",):
            assert f"{name}" in text, name
