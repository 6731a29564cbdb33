"""Request traces: the JSONL format ``serrano serve`` reads and writes, and generators
for fixed input/output lengths and for agent conversations (docs/serving.md#traces).

One JSON object per line::

    {"id": "c0.t1", "arrival": 0.0, "input": 320, "output": 48,
     "conversation": "c0", "prefix": 256, "tool_wait": 0.5}

``id`` (unique), ``arrival`` (seconds, >= 0), ``input`` (prompt tokens, >= 1) and
``output`` (tokens to generate, >= 1) are required. A conversation's turns share its
``conversation`` name and are listed in order; a turn is sent no earlier than
``arrival`` and no earlier than ``tool_wait`` seconds after the previous turn completed;
its first ``prefix`` prompt tokens are the previous turn's whole context (its prompt and
answer), which the chip reuses if it still holds that KV cache (a hit) and prefills
again if not (a miss).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

__all__ = ["Request", "TraceError", "agent_trace", "fixed_trace", "read_trace", "write_trace"]

#: InferenceX draws each request's lengths uniformly from this share of the nominal.
LENGTH_RANGE = (0.8, 1.0)


class TraceError(ValueError):
    """A trace that cannot be served as written (its line number in the message)."""


@dataclass(frozen=True)
class Request:
    """One model call: ``input`` prompt tokens (the first ``prefix`` of them the
    conversation's previous context), ``output`` tokens to generate."""
    id: str
    arrival: float
    input: int
    output: int
    conversation: str | None = None
    prefix: int = 0
    tool_wait: float = 0.0

    def to_json(self) -> dict:
        """The trace line's fields, defaults left out."""
        out = asdict(self)
        for key, default in (("conversation", None), ("prefix", 0), ("tool_wait", 0.0)):
            if out[key] == default:
                del out[key]
        return out


_FIELDS = {"id": str, "arrival": (int, float), "input": int, "output": int,
           "conversation": str, "prefix": int, "tool_wait": (int, float)}
_REQUIRED = ("id", "arrival", "input", "output")


def parse_request(line: str, where: str) -> Request:
    """One trace line as a Request; TraceError naming ``where`` (file:line) if it is not
    one."""
    try:
        fields = json.loads(line)
    except json.JSONDecodeError as error:
        raise TraceError(f"{where}: not JSON ({error.msg})") from None
    if not isinstance(fields, dict):
        raise TraceError(f"{where}: a request is a JSON object, not {type(fields).__name__}")
    unknown = sorted(set(fields) - set(_FIELDS))
    if unknown:
        raise TraceError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(_FIELDS)})")
    for name in _REQUIRED:
        if name not in fields:
            raise TraceError(f"{where}: missing field {name!r}")
    for name, value in fields.items():
        if isinstance(value, bool) or not isinstance(value, _FIELDS[name]):
            raise TraceError(f"{where}: {name} must be "
                             f"{'a string' if _FIELDS[name] is str else 'a number'}, "
                             f"not {value!r}")
    request = Request(**{**fields, "arrival": float(fields["arrival"]),
                         "tool_wait": float(fields.get("tool_wait", 0.0))})
    for name in ("input", "output"):
        if getattr(request, name) < 1:
            raise TraceError(f"{where}: {name} must be >= 1, not {getattr(request, name)}")
    for name in ("arrival", "tool_wait"):
        value = getattr(request, name)
        if not np.isfinite(value) or value < 0:
            raise TraceError(f"{where}: {name} must be a finite number >= 0, not {value}")
    if not 0 <= request.prefix < request.input:
        raise TraceError(f"{where}: prefix must be in 0..input - 1 ({request.input - 1}), "
                         f"not {request.prefix}")
    if request.prefix and request.conversation is None:
        raise TraceError(f"{where}: a prefix needs the conversation it continues")
    return request


def read_trace(path: Path) -> list[Request]:
    """Every request of a JSONL trace (blank lines skipped); TraceError for a file that
    cannot be read as UTF-8 text, and with the line number of the first line that is
    not a request, repeats an id, or continues a conversation with a prefix longer than
    that conversation's previous context."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise TraceError(f"{path}: cannot read the trace ({error.strerror})") from None
    except UnicodeDecodeError as error:
        raise TraceError(f"{path}: not a text file (byte {error.start}: "
                         f"{error.reason})") from None
    requests: list[Request] = []
    seen: set[str] = set()
    context: dict[str, int] = {}
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        request = parse_request(line, where)
        if request.id in seen:
            raise TraceError(f"{where}: id {request.id!r} repeats an earlier request")
        seen.add(request.id)
        if request.conversation is not None:
            held = context.get(request.conversation, 0)
            if request.prefix > held:
                raise TraceError(f"{where}: prefix {request.prefix} is longer than "
                                 f"conversation {request.conversation!r}'s previous "
                                 f"context ({held} tokens)")
            context[request.conversation] = request.input + request.output
        requests.append(request)
    if not requests:
        raise TraceError(f"{path}: no requests")
    return requests


def write_trace(path: Path, requests: list[Request]) -> None:
    """``requests`` as a JSONL trace."""
    Path(path).write_text("".join(json.dumps(r.to_json()) + "\n" for r in requests))


def _length(rng: np.random.Generator, nominal: int) -> int:
    low, high = LENGTH_RANGE
    return max(1, int(rng.integers(int(np.ceil(nominal * low)), nominal + 1)))


def fixed_trace(isl: int, osl: int, requests: int, seed: int = 1) -> list[Request]:
    """InferenceX's fixed-length benchmark: ``requests`` independent calls, all sent at
    once (the client's concurrency paces them), input and output lengths drawn uniformly
    from 80-100 % of ``isl`` and ``osl``."""
    for name, value in (("isl", isl), ("osl", osl), ("requests", requests)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, not {value}")
    rng = np.random.default_rng(seed)
    return [Request(f"r{i}", 0.0, _length(rng, isl), _length(rng, osl))
            for i in range(requests)]


def agent_trace(conversations: int, turns: int, prompt: int, tool: int, answer: int,
                tool_wait: float, burst: int = 1, gap: float = 0.0,
                seed: int = 1) -> list[Request]:
    """Agent conversations: each a ``prompt``-token first call, then ``turns - 1`` calls
    that append a tool result (``tool`` tokens) to the whole previous context after a
    ``tool_wait``-second tool call; every call answers ``answer`` tokens (lengths drawn
    at 80-100 % of nominal). Conversations start in bursts of ``burst``, ``gap``
    seconds apart."""
    for name, value in (("conversations", conversations), ("turns", turns),
                        ("prompt", prompt), ("tool", tool), ("answer", answer),
                        ("burst", burst)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, not {value}")
    if tool_wait < 0 or gap < 0:
        raise ValueError("tool_wait and gap must be >= 0")
    rng = np.random.default_rng(seed)
    out = []
    for c in range(conversations):
        start, context = (c // burst) * gap, 0
        for t in range(turns):
            new = _length(rng, prompt if t == 0 else tool)
            output = _length(rng, answer)
            out.append(Request(f"c{c}.t{t}", start, context + new, output, f"c{c}", context,
                               tool_wait if t else 0.0))
            context += new + output
    return out
