"""The fault campaign behind ``python -m dra.bench faults``.

- ``spec``: in-process fault specs (``kill:reshard:1``), shared by the Python worker and the C++
  example (``--test-fault``);
- ``trial``: the job of a trial, its launcher, the driver that watches records and injects faults
  from outside (kill -9, SIGSTOP/SIGCONT, the store killed);
- ``registry``: what a fault kind is and ``register``; ``process``, ``outside``, ``launchers``: the
  kinds, by class; ``kinds``: all of them by name, and a trial from a seed and a kind;
- ``check``: what every trial must satisfy (exactly-once data, identical state, every process
  ended with the right code, only the dead reported gone) and the resume time;
- ``worker``: the Python worker.
"""
