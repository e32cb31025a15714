"""Job specs as the pool reads them: a JSON Schema that checks every field's type and range (the
schema is the one description of a spec: ``GET /schema`` serves it), the request the scheduler
sees, and the speedup curve a job's reports give the arbiter."""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

from dra import _core
from dra._core import pool as _p

# Said at the submission of a service without autoscale.replica_rps: the default capacity is a
# guess (a service serving 10 requests/s a replica asked for 3 replicas at 1.5 requests/s).
DEFAULT_CAPACITY_NOTE = ("autoscale.replica_rps is not set: until the service reports the rate one replica serves "
                         "(replica_rps), a replica counts as serving 1 request/s; set it or report it "
                         "(docs/guide/pool.md, Inference services)")
REQUEST_FIELDS = ("kind", "device_type", "memory_gb", "fraction", "min_size", "max_size", "priority", "elastic", "gang")
AUTOSCALE_FIELDS = ("replica_rps", "up_utilisation", "target_utilisation", "down_utilisation", "down_delay_s",
                    "peak_window_s", "queue_per_replica")

_NUMBER = {"type": "number"}
#: The least share of a device a worker may ask for: the finest share any enforcement holds (a GPU
#: fraction's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is a whole percent). On a CPU slot the floor is
#: higher and depends on the slot (its quota and memory: PoolService refuses less at submission).
#: The core's request check holds the same limits (``dra::pool::min_fraction``, ``max_workers``).
MIN_FRACTION: float = _p.MIN_FRACTION
MAX_WORKERS: int = _p.MAX_WORKERS
_SECONDS = {"type": "number", "minimum": 0, "maximum": 86400 * 365}

#: A job spec (JSON Schema, draft 2020-12). ``x-fix`` is the hint an error message ends with.
SPEC_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "dra pool job spec",
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                 "x-fix": "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"},
        "kind": {"enum": ["training", "inference"]},
        "device_type": {"type": "string", "minLength": 1, "x-fix": "name a type the pool has, or 'any'"},
        "memory_gb": {"type": "number", "minimum": 0, "x-fix": "give the memory each worker needs in GB"},
        "fraction": {"type": "number", "minimum": MIN_FRACTION, "maximum": 1,
                     "x-fix": f"give a share of one device in [{MIN_FRACTION}, 1] ({MIN_FRACTION} is the finest any "
                              "lease is held to: MPS thread percentages are whole percents, and a CPU slot's lease "
                              "has its own, larger floor); for more than one device ask for more workers "
                              "(min_size/max_size)"},
        "min_size": {"type": "integer", "minimum": 1, "maximum": MAX_WORKERS},
        "max_size": {"type": "integer", "minimum": 1, "maximum": MAX_WORKERS},
        "priority": {"enum": ["low", "normal", "high", "critical"]},
        "elastic": {"type": "boolean"},
        "gang": {"type": "boolean"},
        "command": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1},
                    "x-fix": 'give the program and its arguments as a list, e.g. ["python", "train.py"] '
                             '(a shell line: ["sh", "-c", "..."])'},
        "env": {"type": "object", "propertyNames": {"pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"},
                "additionalProperties": {"type": "string"},
                "x-fix": 'give variables as {"NAME": "value"}, every value a string'},
        "cwd": {"type": "string", "pattern": "^/", "x-fix": "give an absolute path to an existing directory"},
        "log": {"type": "string", "minLength": 1, "x-fix": "give a directory for the workers' logs"},
        "log_limit_mb": {"type": "number", "minimum": 1, "maximum": 2**30,
                         "x-fix": "give the most MiB one worker's log may hold (default 1024)"},
        "autoscale": {"type": "object", "additionalProperties": False,
                      "properties": {k: {**_NUMBER, "minimum": 0} for k in AUTOSCALE_FIELDS},
                      "x-fix": "valid: " + ", ".join(AUTOSCALE_FIELDS)},
        "options": {"type": "object", "x-fix": "give the job's controller options (dra.Options.names())"},
        "resize_cost_s": _SECONDS,
        "resize_cooldown_s": _SECONDS,
        "shrink_grace_s": _SECONDS,
        "max_restarts": {"type": "integer", "minimum": 0, "maximum": 1000,
                         "x-fix": "give how many times the pool starts the job again after it failed (0: never)"},
        "declared_steps": {"type": "integer", "minimum": 1, "maximum": 10**15,
                           "x-fix": "give the job's budget in optimizer steps (or leave it out)"},
        "job_class": {"type": "string", "minLength": 1,
                      "x-fix": "name the kind of job (jobs of a class share the remaining-work history)"},
        "zygote": {"type": "boolean"},
        "preload": {"type": "array", "items": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_.]*$"},
                    "x-fix": 'give module names, e.g. ["torch", "dra.elastic"]'},
        "ray": {"type": ["string", "boolean"],
                "x-fix": "true (the pool's Ray cluster) or the cluster's address (host:port)"},
        "user": {"type": "string", "minLength": 1, "x-fix": "name a user of the pool's machine (operators only)"},
        "network": {"enum": ["private", "host"]},
    },
}

SPEC_FIELDS = tuple(SPEC_SCHEMA["properties"])
_JSON_TYPES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
               dict: "an object", type(None): "null"}
_WANT = {"array": "a list", "object": "an object", "integer": "an integer", "number": "a number",
         "boolean": "true or false", "string": "a string"}


def _validator() -> Any:
    import jsonschema

    base = jsonschema.Draft202012Validator
    # JSON Schema counts 2.0 as an integer; a size of 2.0 is a client's mistake worth naming.
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _c, x: isinstance(x, int) and not isinstance(x, bool))

    def pattern(_v: Any, regex: str, instance: Any, _s: Any) -> Any:
        # JSON Schema's patterns are ECMA-262's, whose "$" is the end of the string; Python's also
        # matches before a final newline, so a name "a\n" or a variable "PATH\n" passed.
        if isinstance(instance, str) and not re.search(re.sub(r"(?<!\\)\$$", r"\\Z", regex), instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {regex!r}")

    return jsonschema.validators.extend(base, validators={"pattern": pattern}, type_checker=checker)(SPEC_SCHEMA)


_VALIDATOR: Any = None


def _where(path: Any) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _message(err: Any) -> str:
    """One schema error as ``field: problem; fix``."""
    field = _where(err.absolute_path)
    sub = err.schema if isinstance(err.schema, dict) else {}
    top = SPEC_SCHEMA["properties"].get(err.absolute_path[0], {}) if err.absolute_path else {}
    fix = sub.get("x-fix") or top.get("x-fix")
    x = err.instance
    got = f"{json.dumps(x)[:60]} ({_JSON_TYPES.get(type(x), type(x).__name__)})"
    v = err.validator
    if v == "additionalProperties" and not err.absolute_path:
        extra = sorted(set(x) - set(SPEC_FIELDS))
        return f"{extra[0]}: unknown job field; valid: {', '.join(SPEC_FIELDS)}"
    if v == "additionalProperties":
        extra = sorted(set(x) - set(sub.get("properties", {})))
        return f"{field}.{extra[0]}: unknown; {fix or 'remove it'}"
    if v == "required":
        return "name: a job needs a name (a string)"
    if v == "type":
        wants = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
        want = " or ".join(_WANT.get(w, w) for w in wants)
        hint = ""
        if isinstance(x, str) and set(wants) & {"integer", "number"}:
            hint = f"; write {x.strip()} without quotes" if x.strip().lstrip("-").replace(".", "", 1).isdigit() else ""
        return f"{field}: must be {want}, got {got}{hint or ('; ' + fix if fix else '')}"
    if "propertyNames" in err.absolute_schema_path:
        return f"{field}: {json.dumps(x)[:60]} is not a variable name; {fix}"
    if v == "enum":
        return f"{field}: unknown value {json.dumps(x)}; use one of {', '.join(map(str, err.validator_value))}"
    if v in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        op = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}[v]
        return f"{field}: must be {op} {err.validator_value}, got {x}" + (f"; {fix}" if fix else "")
    if v in ("pattern", "minLength", "minItems"):
        what = "must not be empty" if v != "pattern" else f"{json.dumps(x)[:60]} is not valid"
        return f"{field}: {what}; {fix or 'see the job spec schema (dra pool schema)'}"
    return f"{field or 'spec'}: {err.message}" + (f"; {fix}" if fix else "")


_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON's "\\ud800" alone: a str Python cannot encode
#: The kernel's limits on what a program is started with (execve): one argument or ``NAME=value``
#: at most MAX_ARG_STRLEN bytes with its NUL, and all of them together, with a pointer each, at
#: most ARG_MAX (the stack limit / 4 on Linux). The pool adds its own variables to a worker's
#: (DRA_*, PATH, ...): EXEC_RESERVE bytes are kept for them.
MAX_ARG_STRLEN = 32 * 4096
EXEC_RESERVE = 64 << 10


def _arg_max() -> int:
    import os

    try:
        return int(os.sysconf("SC_ARG_MAX"))
    except (ValueError, OSError):
        return 2 << 20


def _too_big_to_exec(spec: dict[str, Any]) -> tuple[str, str] | None:
    """(field, problem) when the job's command and variables cannot start a program: the launcher
    would meet E2BIG ("Argument list too long") only when it starts a worker."""
    fix = "pass large data in a file (or through the job's cwd) instead"
    total = 0
    items: list[tuple[str, str]] = []
    for i, a in enumerate(spec.get("command") or []):
        items.append((f"command[{i}]", a))
    for k, v in (spec.get("env") or {}).items():
        items.append((f"env.{k}", f"{k}={v}"))
    if spec.get("options"):
        items.append(("options", "DRA_OPTIONS=" + json.dumps(spec["options"])))  # the workers get them in one variable
    for field, text in items:
        n = len(text.encode()) + 1
        if n > MAX_ARG_STRLEN:
            return field, (f"{n} bytes; the kernel starts a program with at most {MAX_ARG_STRLEN - 1} bytes in one "
                           f"argument or variable (MAX_ARG_STRLEN); {fix}")
        total += n + 8
    limit = _arg_max() - EXEC_RESERVE
    if total > limit:
        field = "env" if spec.get("env") else "command"
        return field, (f"the command and variables take {total} bytes; the kernel starts a program with at most "
                       f"{limit + EXEC_RESERVE} (ARG_MAX), {EXEC_RESERVE} of them kept for the pool's own variables; {fix}")
    return None


def _unusable(value: Any, path: list[Any]) -> tuple[list[Any], str] | None:
    """The first value anywhere in a spec (keys included) that no program can be given, as
    (path, problem): a string with a NUL byte (the kernel ends every argument, variable and path at
    the first NUL; Python refuses one only when the job starts, in its launcher) or a number that
    is not finite (JSON has no NaN or Infinity, yet Python's reader takes them, and NaN passes
    every range check), or a lone surrogate (JSON's ``"\\ud800"``: not text, so it cannot be
    encoded for the kernel; the launcher failed on it, and a job class holding one stalled the loop)."""
    nul = "contains a NUL byte (\\0){}, which no program can be given (the kernel ends strings there); remove it"
    if isinstance(value, str):
        if "\0" in value:
            return path, nul.format(f" at character {value.index(chr(0))}")
        bad = _SURROGATE.search(value)
        if bad:
            return path, (f"contains a lone surrogate ({ascii(bad.group())}) at character {bad.start()}, which is not "
                          "text (it has no UTF-8 form: no program, variable or path can hold it); remove it")
    elif isinstance(value, float):
        if not math.isfinite(value):
            return path, f"must be a finite number, got {value}; give a finite number"
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and ("\0" in k or _SURROGATE.search(k)):
                return path, f"the name {json.dumps(k)[:60]} " + (nul.format("") if "\0" in k else
                                                                  "contains a lone surrogate, which is not text; remove it")
            found = _unusable(v, [*path, k])
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _unusable(v, [*path, i])
            if found:
                return found
    return None


def validate_spec(spec: Any) -> dict[str, Any]:
    """Checks a job spec's fields for types and ranges (the schema above) and returns a copy with
    the scheduler's defaults filled in; raises ValueError(``field: problem; fix``) for the first
    problem (the one earliest in the spec's field order). Pool-dependent checks (device types,
    what fits) are the C++ request's ``validate``."""
    global _VALIDATOR
    if not isinstance(spec, dict):
        raise ValueError(f"spec: must be a JSON object of job fields, got {_JSON_TYPES.get(type(spec), type(spec).__name__)}")
    if _VALIDATOR is None:
        _VALIDATOR = _validator()
    order = {k: i for i, k in enumerate(spec)}
    problems: list[tuple[tuple[int, int, int], str]] = []
    errors = list(_VALIDATOR.iter_errors(spec))
    if errors:
        first = min(errors, key=lambda e: (order.get(e.absolute_path[0], -1) if e.absolute_path else -1,
                                           len(e.absolute_path)))
        problems.append(((order.get(first.absolute_path[0], -1) if first.absolute_path else -1,
                          len(first.absolute_path), 1), _message(first)))
    # Strings and numbers the schema lets through that no program can take (NUL bytes, NaN):
    # a field's value, or the spec's own keys (an unknown key with a NUL is named unknown first).
    for key, value in spec.items():
        found = _unusable(value, [key])
        if found:
            path, problem = found
            problems.append(((order[key], len(path), 0), f"{_where(path)}: {problem}"))
            break
    if problems:
        raise ValueError(min(problems)[1])
    too_big = _too_big_to_exec(spec)
    if too_big:
        raise ValueError(f"{too_big[0]}: {too_big[1]}")
    return copy.deepcopy(spec)


def schema() -> dict[str, Any]:
    """The job spec's JSON Schema (a copy)."""
    return copy.deepcopy(SPEC_SCHEMA)


def request_from_spec(spec: dict[str, Any]) -> Any:
    """The scheduler's request for a spec, its fields checked first (``validate_spec``)."""
    return make_request(validate_spec(spec))


def make_request(spec: dict[str, Any]) -> Any:
    """The scheduler's request for a spec already checked (one the pool stored)."""
    r = _p.Request()
    r.job = spec["name"]
    for k in REQUEST_FIELDS:
        if k in spec:
            setattr(r, k, spec[k])
    return r


#: A size's measured samples/s counts once the job ran at that size this long (seconds, ``rate_s``):
#: a second's measurement at a size the job just reached (or soon left) is mostly noise.
MIN_RATE_S = 3.0


def fit_speedup(report: dict[str, Any] | None, max_size: int, sigma0: float = 0.1,
                held: list[float] | None = None, cap: bool = True) -> tuple[list[float], str]:
    """Speedup over one worker for k = 0..max_size from a training job's report (the elastic
    controller's, docs/guide/elastic.md), and where it came from:

    - ``"rates"``: the samples/s the job measured at two or more sizes (``rates``: {size: samples/s},
      each measured for at least ``MIN_RATE_S`` according to ``rate_s``, when the report has it),
      fitted to k / (1 + sigma (k - 1)) (Amdahl-like; least squares of k/rate = a + b (k - 1));
    - ``"throughput"``: else the controller's step-time fit (``throughput``: compute time per step
      a + b * per-rank batch, all-reduce time c + d * (k - 2) from two workers on), at the job's
      ``global_batch``;
    - ``"prior"``: else sigma = ``sigma0`` (an estimate).

    ``held``: the curve the pool fitted for the job before. While the job's current size (the
    report's ``world``) has run less than ``MIN_RATE_S``, a step-time fit is not taken: it holds
    that size's first steps, as noisy as its first second of samples/s (one fit on a fresh size said
    two workers were slower than one, and a pool shrank a lone job that grew back seconds later).
    The held curve is kept (``"held: ..."``), cut or extended flat to ``max_size``; so it is when
    the step-time fit cannot be used at all. ``cap`` False: the curve before ``capped`` (what the
    pool keeps to hold: a cap of the past must not outlive the job's policy changing its mind).

    A job whose own policy wants fewer workers (``desired_size``, unless its policy is ``none``:
    the pool alone decides its size) gains nothing past that size."""
    report = report or {}
    rates = {}
    seconds = report.get("rate_s")
    for k, v in (report.get("rates") or {}).items():
        if float(v) > 0 and (seconds is None or float(seconds.get(k, 0.0)) >= MIN_RATE_S):
            rates[int(k)] = float(v)
    curve: list[float] | None = None
    source = "prior"
    if len(rates) >= 2:
        sigma = _amdahl_sigma(rates)
        if sigma is not None:
            curve, source = [0.0] + [k / (1.0 + sigma * (k - 1)) for k in range(1, max_size + 1)], "rates"
    tp = report.get("throughput") or {}
    batch = float(report.get("global_batch") or 0)
    if curve is None and int(tp.get("observations") or 0) >= 10 and batch > 0:
        def step(k: int) -> float:
            sync = float(tp["sync_fixed_s"]) + float(tp["sync_per_rank_s"]) * (k - 2) if k >= 2 else 0.0
            return float(tp["compute_fixed_s"]) + float(tp["compute_per_sample_s"]) * batch / k + max(0.0, sync)

        if step(1) > 0 and all(step(k) > 0 for k in range(2, max_size + 1)):
            curve, source = [0.0] + [step(1) / step(k) for k in range(1, max_size + 1)], "throughput"
    world = report.get("world")
    ran = float(seconds.get(str(world), 0.0)) if isinstance(world, int) and isinstance(seconds, dict) else MIN_RATE_S
    if held and (curve is None or source == "throughput" and ran < MIN_RATE_S):
        # (A step-time fit that cannot be used, e.g. one that predicts a step <= 0, keeps the curve
        # measured before too, rather than the prior.)
        why = f"size {world} measured for {ran:.1f} s of {MIN_RATE_S:g}" if curve is not None else "no usable fit"
        curve = [float(x) for x in held[: max_size + 1]]
        curve += [curve[-1]] * (max_size + 1 - len(curve))
        source = f"held: {why}"
    if curve is None:
        curve = [0.0] + [k / (1.0 + sigma0 * (k - 1)) for k in range(1, max_size + 1)]
    if cap:
        curve = capped(curve, report)
    return curve, source


def capped(curve: list[float], report: dict[str, Any] | None, current: int | None = None) -> list[float]:
    """The curve flat past the size the job's own policy wants (its report's ``desired_size``),
    unless that policy is ``none`` (the pool alone decides its size), or unless it wants the size it
    runs at, ``current``, and never ran larger: such a policy cannot tell what more devices would
    bring (a job the pool started on one slot kept one while two sat idle, an outside review),
    so the pool's curve stands until the job has been measured there. A policy that gave devices
    back (it wants less than it holds, or as many after running larger) keeps its cap."""
    report = report or {}
    out = list(curve)
    desired = report.get("desired_size")
    if current is not None and isinstance(desired, int) and desired >= current:
        rates = report.get("rates") if isinstance(report.get("rates"), dict) else {}
        if not any(str(k).isdigit() and int(k) > current for k in rates):
            return out
    if report.get("policy") != "none" and isinstance(desired, int) and 1 <= desired < len(out) - 1:
        for k in range(desired + 1, len(out)):
            out[k] = out[desired]
    return out


def remaining_size_s(estimate: Any, report: dict[str, Any] | None, speedup: list[float], current: int) -> float:
    """Remaining work in seconds on one worker: the estimate's Gittins size (steps) times the seconds
    one worker needs per step (global batch / samples per second at the current size, scaled by the
    speedup there). -1 when the job has not reported a rate yet."""
    report = report or {}
    rate = float(report.get("samples_per_s") or 0.0)
    batch = float(report.get("global_batch") or 0.0)
    k = max(1, current)
    if rate <= 0 or batch <= 0 or k >= len(speedup) or speedup[k] <= 0:
        return -1.0
    one_worker_s_per_step = batch / (rate / speedup[k])
    return float(_core.gittins_size(estimate, float(report.get("step", 0)))) * one_worker_s_per_step


def speedup_curve(report: dict[str, Any] | None, max_size: int, sigma0: float = 0.1) -> list[float]:
    """``fit_speedup``'s curve alone."""
    return fit_speedup(report, max_size, sigma0)[0]


def _amdahl_sigma(rates: dict[int, float]) -> float | None:
    xs = [k - 1.0 for k in rates]
    ys = [k / v for k, v in rates.items()]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    return min(max(b / a, 0.0), 1.0) if a > 0 else None
