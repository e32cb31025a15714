"""What the pool writes for others to read, with a real PoolService: its events file stays bounded
over a long life (rotated by size, the oldest files deleted, every kept line readable in order:
dra.pool._events), and its metrics parse as Prometheus text whatever the names in them."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from dra._core import pool as P
from dra.pool import _events
from dra.pool.gantt import leases
from dra.pool.service import PoolService


def declared(n: int) -> list:
    return [P.Device(id=f"d{i}", type="cpu-slot", memory_gb=2.0) for i in range(n)]


def test_the_events_file_is_rotated_by_size_and_the_oldest_files_are_deleted(tmp_path: Path) -> None:
    max_mb = 4 / 1024  # 4 KiB: a few dozen lines a file
    svc = PoolService(declared(2), tmp_path, launch_jobs=False, events_max_mb=max_mb)
    try:
        for i in range(150):
            svc.submit({"name": f"job{i}", "min_size": 1, "max_size": 1})
            svc.tick()
            svc.cancel(f"job{i}")
        svc.tick()
    finally:
        svc.close()
    path = tmp_path / "events.jsonl"
    files = _events.rotated(path)
    assert [p.name for p in files] == ["events.jsonl.3", "events.jsonl.2", "events.jsonl.1", "events.jsonl"]
    assert not (tmp_path / "events.jsonl.4").exists()
    longest = max(len(line) + 1 for p in files for line in p.read_text().splitlines())
    for p in files:
        assert p.stat().st_size <= 4096 + longest, p
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    kept = list(_events.read(path))
    times = [e["time"] for e in kept]
    assert times == sorted(times)
    # Each new file starts with a line naming the one it followed; the oldest submissions are gone.
    for p in files[1:]:
        first = json.loads(p.read_text().splitlines()[0])
        assert first["event"] == "events_rotated" and first["previous"] == "events.jsonl.1"
        assert first["previous_bytes"] <= 4096
    submitted = [e["job"] for e in kept if e["event"] == "submit"]
    assert "job149" in submitted and "job0" not in submitted
    assert submitted == sorted(submitted, key=lambda n: int(n[3:]))
    assert leases(kept) is not None  # the Gantt reads the kept history like one file


def test_a_cut_line_is_skipped_and_bad_sizes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = _events.EventFile(path, 1.0)
    log.append({"time": 1.0, "event": "a"})
    with open(path, "a") as f:
        f.write('{"time": 2.0, "ev')  # a daemon killed while it wrote
    with open(path, "a") as f:
        f.write("\n")
    log.append({"time": 3.0, "event": "b"})
    assert [e["event"] for e in _events.read(path)] == ["a", "b"]
    for bad in (0, -1, float("inf"), float("nan"), "64", True):
        with pytest.raises(ValueError, match=r"^events_max_mb: .*got"):
            _events.EventFile(path, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^events_keep: "):
        _events.EventFile(path, 1.0, keep=0)


def test_a_symbolic_link_in_place_of_the_events_file_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    path = tmp_path / "events.jsonl"
    os.symlink(target, path)
    with pytest.raises(OSError):
        _events.EventFile(path, 1.0).append({"time": 1.0, "event": "a"})
    assert target.read_text() == ""


def test_the_metrics_parse_as_prometheus_text_and_agree_with_the_status(tmp_path: Path) -> None:
    # Parsed by the Prometheus project's own client library, not by a regular expression of ours; a
    # pool name with a quote, a backslash and a newline (unchecked without cgroup slots) used to
    # break the exposition for every scraper.
    from prometheus_client.parser import text_string_to_metric_families

    odd = 'lab "b"\\n\nx'
    svc = PoolService(declared(3), tmp_path, launch_jobs=False, name=odd)
    try:
        svc.submit({"name": "a", "min_size": 2, "max_size": 2})
        svc.submit({"name": "b", "min_size": 2, "max_size": 2})
        svc.tick()
        families = {f.name: f for f in text_string_to_metric_families(svc.metrics())}
    finally:
        svc.close()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("dra_pool_devices", (("pool", odd),))] == 3
    assert samples[("dra_pool_devices_leased", (("pool", odd),))] == 2
    # No launcher here: both jobs stay waiting, the first holding its two leases.
    assert samples[("dra_pool_job_workers", (("job", "a"), ("pool", odd), ("state", "waiting")))] == 2
    assert samples[("dra_pool_job_workers", (("job", "b"), ("pool", odd), ("state", "waiting")))] == 0
    assert samples[("dra_pool_jobs", (("pool", odd), ("state", "waiting")))] == 2
    assert samples[("dra_pool_events_total", (("kind", "grants"), ("pool", odd)))] == 2
    assert families["dra_pool_events"].type == "counter"  # _total is the counter's sample suffix


def test_a_reader_sees_one_consistent_history_while_the_daemon_rotates(tmp_path: Path) -> None:
    import threading
    import time

    path = tmp_path / "events.jsonl"
    log = _events.EventFile(path, 600 / (1 << 20))  # 600 bytes a file: a rotation every few lines
    stop = threading.Event()
    written = [0]

    def write() -> None:
        while not stop.is_set():
            written[0] += 1
            log.append({"time": float(written[0]), "event": "x", "pad": "y" * 40})

    writer = threading.Thread(target=write)
    writer.start()
    reads = 0
    deadline = time.monotonic() + 1.5
    try:
        while time.monotonic() < deadline:
            got = [int(e["time"]) for e in _events.read(path) if e["event"] == "x"]
            reads += 1
            # One snapshot: every event between the oldest and the newest kept, once each, in order.
            assert got == list(range(got[0], got[-1] + 1)) if got else True, got
    finally:
        stop.set()
        writer.join()
    assert reads > 10 and written[0] > 100


def test_a_lease_granted_before_the_oldest_kept_file_is_still_drawn() -> None:
    events = [{"time": 10.0, "event": "events_rotated"},
              {"time": 12.0, "event": "release", "job": "a", "lease": 1, "device": "d0"},  # its grant rotated away
              {"time": 13.0, "event": "grant", "job": "b", "lease": 2, "device": "d0"},
              {"time": 15.0, "event": "release", "job": "b", "lease": 2, "device": "d0"}]
    assert sorted(leases(events)) == [("d0", "a", 10.0, 12.0, None), ("d0", "b", 13.0, 15.0, None)]


def test_answers_past_the_slo_are_marked_on_the_gantt_chart(tmp_path: Path) -> None:
    """The main job's chart marks when its service missed the SLO: the same events drawn with and
    without the marks differ, and only where the marks are (the chart's foot)."""
    pytest.importorskip("matplotlib")
    from PIL import Image

    from dra.pool.gantt import plot

    svc = PoolService(declared(2), tmp_path / "state", launch_jobs=False)
    try:
        svc.submit({"name": "serve", "kind": "inference", "min_size": 1, "max_size": 2})
        svc.tick()
    finally:
        svc.close()
    events = tmp_path / "state" / "events.jsonl"
    t0 = min(json.loads(x)["time"] for x in events.read_text().splitlines())
    plain = Image.open(plot(events, tmp_path / "plain.png", t0=t0)).convert("RGB")
    marked = Image.open(plot(events, tmp_path / "late.png", t0=t0, late=[t0 + 0.5, t0 + 0.7])).convert("RGB")
    assert plain.size == marked.size
    red = [(x, y) for x in range(marked.width) for y in range(marked.height)
           if marked.getpixel((x, y))[0] > 200 and max(marked.getpixel((x, y))[1:]) < 80
           and plain.getpixel((x, y)) != marked.getpixel((x, y))]
    assert len(red) > 20, "no red marks drawn"
    assert min(y for _, y in red) > marked.height // 3, "the marks are not at the chart's foot"
