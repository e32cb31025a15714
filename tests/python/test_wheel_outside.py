"""Outside review of dra as a user gets it from a wheel: the package installed into site-packages and
used from a folder that is not the checkout, with no repository file to fall back on.

Building a wheel takes many minutes here, so the installed layout is assembled from the same
pieces scikit-build-core puts in one: the Python package (``python/dra``), the compiled modules
this checkout built, and the package data installed by the project's own CMake install rules
(their ``data`` component, installed alone from a configure-only build, nothing compiled). A
subprocess runs with ``python -S`` and that folder ahead of the interpreter's site-packages, so
neither the editable install's import hook nor the checkout is seen.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]


def _cmake() -> str | None:
    return shutil.which("cmake") or shutil.which("cmake", path=str(Path(sys.executable).parent))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site-packages folder holding dra as a wheel installs it."""
    cmake = _cmake()
    if cmake is None:
        pytest.skip("cmake not found: the package data's install rules cannot be run")
    try:
        import pybind11
    except ImportError:
        pytest.skip("pybind11 not installed: the project's CMake configuration needs it")
    modules = [importlib.util.find_spec(name) for name in ("dra._core", "dra._sim")]
    if any(m is None or not m.origin or not m.origin.endswith(".so") for m in modules):
        pytest.skip("dra's compiled modules are not built in this environment")
    top = tmp_path_factory.mktemp("wheel")
    build, out = top / "build", top / "site-packages"
    configure = subprocess.run(
        [cmake, "-S", str(ROOT), "-B", str(build), "-DSKBUILD=ON", "-DDRA_WITH_TORCH=OFF", "-DDRA_BUILD_TESTS=OFF",
         "-DDRA_BUILD_EXAMPLES=OFF", f"-DPython_EXECUTABLE={sys.executable}", f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"],
        capture_output=True, text=True, timeout=180,
    )
    assert configure.returncode == 0, configure.stdout[-3000:] + configure.stderr[-3000:]
    install = subprocess.run([cmake, "--install", str(build), "--component", "data", "--prefix", str(out)],
                             capture_output=True, text=True, timeout=60)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    shutil.copytree(ROOT / "python" / "dra", out / "dra", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for m in modules:
        shutil.copy2(m.origin, out / "dra" / Path(m.origin).name)
    return out


def run_installed(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -S <args>`` in ``cwd`` with the installed layout first on the path, then this
    interpreter's site-packages (torch, numpy) read as plain folders: no .pth file runs, so the
    editable install's hook and the benchmarks' path are not there."""
    paths = dict.fromkeys([str(site), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DRA_SIM_DATA", "DRA_RL_DATA", "DRA_BENCHMARKS")}
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return subprocess.run([sys.executable, "-S", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


WHERE = r"""
import json, dra, dra.rl, dra.sim
from dra.energy import zeus_replay
print(json.dumps({
    "dra": dra.__file__,
    "pollux": str(dra.sim.default_data_dir()),
    "azure": str(dra.rl.data_dir()),
    "zeus": str(zeus_replay.data_dir()),
    "resize_report": str(dra.sim.DEFAULT_RESIZE_REPORT),
    "costs": dra.sim.costs_by_policy(["static", "convergence_aware"], "system"),
}))
"""


def test_the_installed_package_finds_its_data_with_attribution_and_license_outside_the_checkout(site, tmp_path):
    got = run_installed(site, tmp_path, "-c", WHERE)
    assert got.returncode == 0, got.stderr[-3000:]
    where = json.loads(got.stdout)
    assert Path(where["dra"]).is_relative_to(site), where["dra"]
    # Every shipped third-party data set is the installed copy, with its README, license and notice.
    for key, kept in (("pollux", ("LICENSE", "NOTICE", "README.md")), ("azure", ("LICENSE", "NOTICE", "README.md")),
                      ("zeus", ("LICENSE", "README.md"))):
        folder = Path(where[key])
        assert folder.is_relative_to(site), (key, folder)
        for name in kept:
            assert (folder / name).is_file(), f"{key}: {name} missing from the installed copy {folder}"


def test_the_system_cost_view_charges_the_measured_resize_from_an_installed_package(site, tmp_path):
    """`dra-sim replay --cost-mode system` charges dra's policies the measured in-place resize by
    default (docs/guide/simulator.md). The report lived only in docs/results/ of the checkout, so an
    installed dra silently fell back to the 1 s stand-in."""
    import dra.sim

    got = run_installed(site, tmp_path, "-c", WHERE)
    assert got.returncode == 0, got.stderr[-3000:]
    where = json.loads(got.stdout)
    report = Path(where["resize_report"])
    assert report.is_relative_to(site) and report.is_file(), report
    measured = dra.sim.cost_from_resize_report(ROOT / "docs" / "results" / "sim" / "resize-100MB.json")
    assert measured != dra.sim.IN_PLACE_RESIZE_COST_S
    assert where["costs"] == {"static": dra.sim.POLLUX_REALLOCATION_COST_S, "convergence_aware": measured}


def test_dra_sim_replay_as_documented_runs_from_any_folder_on_the_shipped_workload(site, tmp_path):
    """The guide's `dra-sim replay --workload data/pollux/workloads/workload-1.csv` is a checkout's
    path; from another folder it is found in the copy dra ships, and the run says which file."""
    got = run_installed(site, tmp_path, "-m", "dra.sim.cli", "replay", "--workload", "data/pollux/workloads/workload-1.csv",
                        "--policy", "static", "--json", "out.json")
    assert got.returncode == 0, got.stderr[-3000:]
    doc = json.loads((tmp_path / "out.json").read_text())
    assert Path(doc["file"]).is_relative_to(site), doc["file"]
    assert (doc["workload"], doc["load"]) == ("workload-1", "1.0")  # matched to the published figures
    assert "using the copy dra ships" in got.stderr
    # Relative to the shipped folder works too.
    got = run_installed(site, tmp_path, "-m", "dra.sim.cli", "replay", "--workload", "workloads-0.5/workload-2.csv",
                        "--policy", "static", "--quiet", "--json", "half.json")
    assert got.returncode == 0, got.stderr[-3000:]
    assert json.loads((tmp_path / "half.json").read_text())["load"] == "0.5"


def test_a_workload_found_nowhere_is_refused_naming_where_the_shipped_ones_are(site, tmp_path):
    missing = "data/pollux/workloads/" + "workload-9.csv"  # Pollux ships 1-8 (split: no document names it)
    got = run_installed(site, tmp_path, "-m", "dra.sim.cli", "replay", "--workload", missing)
    assert got.returncode == 2, got.stderr[-3000:]
    assert "no such file" in got.stderr and "the workloads dra ships are" in got.stderr, got.stderr
    assert str(site) in got.stderr and "Traceback" not in got.stderr


@pytest.mark.parametrize("command", ["replay", "rl"])
def test_plots_without_matplotlib_are_refused_before_the_run_naming_the_extra(command, tmp_path, monkeypatch, capsys):
    """matplotlib is the optional `plot` extra, absent from a plain `pip install dra`: `--plots`
    failed with an ImportError traceback after the whole simulation."""
    import dra.sim
    from dra.sim.cli import main

    workload = dra.sim.default_data_dir() / "workloads" / "workload-1.csv"
    argv = {"replay": ["replay", "--workload", str(workload), "--policy", "static"],
            "rl": ["rl", "--scenario", "long_tail", "--steps", "20"]}[command]

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--plots", str(tmp_path / "plots"), "--json", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err
    assert "--plots: the plots need matplotlib" in err and "dra[plot]" in err, err
    assert not (tmp_path / "out.json").exists()  # refused before anything ran
