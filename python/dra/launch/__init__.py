"""``dra run``: a torchrun drop-in whose workers survive each other (docs/guide/launch.md).

``cli`` reads torchrun's flags; ``rendezvous`` places this node in the job (one node, torch's c10d
rendezvous, or the static form); ``node`` starts and supervises this node's workers (the process
machinery, a warm fork server or plain processes, is the device pool's: ``dra.pool._spawner``);
``tee`` copies their output to the console with torchrun's prefixes.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from dra.launch.cli import main as run

    return run(argv)
