"""Shared by the dra-sim tests that feed it inputs of their own: a workload CSV, and a refusal
(exit 2, one line on stderr, no traceback) checked for the words it must name."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra.sim import cli

HEADER = "name,time,application,num_replicas,batch_size"


def _csv(tmp_path: Path, rows: list[str], name: str = "w.csv", header: str = HEADER, end: str = "\n") -> Path:
    path = tmp_path / name
    path.write_text("\n".join([header, *rows]) + end)
    return path


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> str:
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(n in err for n in needles), err
    return err
