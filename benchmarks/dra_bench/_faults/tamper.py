"""What a fault trial breaks from outside its job, with no knowledge of trials or fault kinds: a
small filesystem it can make read-only, fill or replace by a file, and another client of the job's
store that writes bad values into the protocol's keys. ``trial`` uses them while a trial runs,
``outside`` registers the fault kinds that ask for them, ``fuzz`` shares the bad values.

A ``view`` below is the driver's view of the running trial (``dra_bench._faults.trial.View``: the
world's epoch and members, the step, the store's address, the job id)."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

View = Any

# ---- the filesystem ----------------------------------------------------------------------------------
FS_BYTES = 256 * 1024
_mount_ok: str | None = None  # "" once a mount worked, else why not


def mount_unavailable() -> str:
    """Why this machine cannot mount a small tmpfs ("" when it can): the filesystem kinds need root."""
    global _mount_ok
    if _mount_ok is None:
        probe = Path(f"/tmp/dra-faults-mount-probe-{os.getpid()}")
        probe.mkdir(exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)], capture_output=True, text=True)
        _mount_ok = "" if r.returncode == 0 else f"mounting a tmpfs failed ({(r.stderr or r.stdout).strip()[:120]}): needs root"
        if r.returncode == 0:
            subprocess.run(["umount", "-l", str(probe)], capture_output=True)
        probe.rmdir()
    return _mount_ok


class TrialFilesystem:
    """The folder a filesystem trial breaks: a 256 KiB tmpfs ("tmpfs") or a plain folder ("dir").
    close() copies what it holds (the events file) to ``<out>/fs-copy`` and unmounts it."""

    def __init__(self, out: Path, mode: str) -> None:
        self.out, self.mode = out, mode
        self.path = out / "fs"
        self.path.mkdir(parents=True, exist_ok=True)
        self.mounted = False
        if mode == "tmpfs":
            r = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES // 1024}k", "tmpfs", str(self.path)],
                capture_output=True,
                text=True,
            )
            if r.returncode != 0:
                raise RuntimeError(f"a filesystem trial could not mount its tmpfs: {r.stderr.strip()}")
            self.mounted = True

    def readonly(self, view: View) -> str | None:
        r = subprocess.run(["mount", "-o", "remount,ro", str(self.path)], capture_output=True, text=True)
        return "fs" if r.returncode == 0 else None

    def full(self, view: View) -> str | None:
        """Fills the filesystem: the next append fits only until the events file's last page is full."""
        try:
            with open(self.path / "filler", "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        except OSError:
            return "fs"

    def not_a_folder(self, view: View) -> str | None:
        """The folder is moved away and a file takes its place: opening the events file fails (ENOTDIR)."""
        self.path.rename(self.out / "fs.moved")
        self.path.write_text("not a folder\n")
        return "fs"

    def close(self) -> None:
        copy = self.out / "fs-copy"
        for folder in (self.path, self.out / "fs.moved"):
            if folder.is_dir():
                copy.mkdir(exist_ok=True)
                for f in folder.glob("events.jsonl"):
                    shutil.copyfile(f, copy / f.name)
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
            self.mounted = False


# ---- another client writing the job's keys ---------------------------------------------------------------
# Every key of the elastic protocol (src/elastic/store_protocol.hpp), with <epoch> and <uid> filled in
# from what the driver sees of the world.
KEY_TEMPLATES = (
    "universe", "late_uid", "cfg/{uid}", "sig/{uid}", "epoch_seq", "dec/{epoch}", "cands", "waiting/{cand}",
    "admit/{cand}", "fault/{epoch}/alive/{uid}", "fault/{epoch}/result", "fault/{epoch}/r1/result", "beat/{uid}",
    "gone/{uid}", "rebuild/{uid}", "child/{epoch}", "child/{epoch}/again", "done", "capacity", "report",
    "word/{epoch}/{step}",
)  # fmt: skip

WRONG_TYPES = (
    b'"x"', b"1.5", b"-1", b"0", b"true", b"false", b"null", b"[]", b"{}", b'[1, "a"]', b'{"max_size": "2"}',
    b'{"max_size": 2.5, "leave": "1"}', b'{"min_size": -3}', b'{"leave": [1.5]}', b'{"epoch": "x", "members": [1]}',
    b'{"epoch": 3, "members": "0,1"}', b'{"epoch": -1, "members": []}', b'{"decision": {}}', b'{"decision": null}',
    b'{"sig": 5}', b'{"model": [["w", "x", 1]]}', b'{"rejected": 5}', b'{"dismissed": null}', b"1e9",
    b"99999999999999999999999", b'"10000,"', b"x,1e9,", b",,,", b"-5,abc,", b'{"parent": "x", "child": 1}',
    b"\xff\xfe\x00", b'"\xff"', b"[" * 2000 + b"]" * 2000,
)  # fmt: skip


def bad_value(rng: random.Random) -> bytes:
    """A value no dra process would write: a wrong JSON type, garbage bytes, a huge or empty one, a
    message cut short, or an integer where a counter or flag should be."""
    k = rng.random()
    if k < 0.35:
        return rng.choice(WRONG_TYPES)
    if k < 0.55:
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64)))
    if k < 0.65:
        return b""
    if k < 0.72:
        return b"x" * rng.choice((65536, 1 << 20, (5 << 20) + 1))  # the last: above the 4 MiB read limit
    if k < 0.85:
        whole = rng.choice((b'{"epoch": 12, "members": [0, 1]}', b'{"max_size": 2, "min_size": 1, "leave": []}',
                            b'{"decision": {"action": "grow"}, "epoch": 4}', b'{"sig": [["w", [2], "torch.float32"]]}'))
        return whole[: rng.randint(1, len(whole) - 1)]
    return str(rng.choice((-7, 0, 1, 2, 3, 10**6, 2**40, 2**62, -(2**63)))).encode()


class StoreFuzzer:
    """Another client of the job's store: from start() to stop(), every `interval_s` it writes one bad
    value into one key of the job's protocol, filled in with the world's current epoch, a member's
    uid, a candidate's uid. stop() returns the number of values written."""

    def __init__(self, view: View, seed: int, interval_s: float) -> None:
        self.view, self.interval_s = view, interval_s
        self.rng = random.Random(f"fuzz:{seed}")
        self.writes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="store-fuzzer", daemon=True)
            self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.writes

    def _key(self) -> str:
        epoch, members = self.view.world
        members = members or [0]
        values = {
            "uid": self.rng.choice(members + [0, 1]),
            "cand": self.rng.choice([10000, 10001, max(members) + 1]),
            "epoch": max(epoch, 1) + self.rng.choice((0, 0, 0, 1, 2, -1)),
            "step": max(self.view.step, 0) + self.rng.choice((0, 1)),
        }
        return self.rng.choice(KEY_TEMPLATES).format(**values)

    def _run(self) -> None:
        import torch.distributed as dist

        host, port = self.view.store.address.rsplit(":", 1)
        prefix = f"dra/{self.view.job_id}/0/"
        client = None
        while not self._stop.wait(self.interval_s):
            try:
                if client is None:
                    client = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=5))
                client.set(prefix + self._key(), bad_value(self.rng))
                self.writes += 1
            except Exception:  # noqa: BLE001 - the store gone (the job ended) or a value it refused
                client = None
                time.sleep(0.05)
