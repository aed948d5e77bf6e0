"""slime's `slime.observability.trace_utils`: per-sample execution traces, and their timeline.

As slime's, each traced `Sample` carries `sample.trace`, a dict `{"version", "trace_id",
"sample_id", "group_id", "attempt", "events": [...]}`; `trace_span` appends a `span_start` and a
`span_end` event (wall-clock `ts` in seconds, `span_id`, `parent_span_id` of the enclosing span of
the same trace, `attrs`), `trace_event` an instant `event`. Tracing never breaks the traced code:
a failure inside the tracing itself is logged at debug level and skipped. The trace travels with
the sample (`Sample.to_dict` keeps it, so the debug rollout dumps hold it as slime's do).

The timeline: `chrome_trace(samples)` turns the samples' traces into Chrome trace-event JSON
(one row per sample, grouped by prompt group; spans as bars, events as marks), which
https://ui.perfetto.dev and chrome://tracing open; `save_rollout_trace(run_dir, rollout_id,
samples)` (from slime.observability.trace_timeline) writes it to `<run-dir>/traces/rollout_<id>.trace.json`, the file the run report
links, and `chrome_trace_from_dump` converts a `--save-debug-rollout-data` file.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from slime.observability.trace_timeline import (
    TRACES_DIR,
    chrome_trace,
    chrome_trace_from_dump,
    save_rollout_trace,
    write_chrome_trace,
)
from slime.utils.types import Sample

__all__ = [
    "TRACE_VERSION",
    "TRACE_CHILDREN_KEY",
    "TraceHandle",
    "TraceSpanContext",
    "bind_trace",
    "bind_trace_carrier",
    "export_trace",
    "import_trace",
    "trace_event",
    "trace_span",
    "trace_next_attempt",
    "trace_function",
    "build_sglang_meta_trace_attrs",
    "chrome_trace",
    "write_chrome_trace",
    "save_rollout_trace",
    "chrome_trace_from_dump",
    "TRACES_DIR",
]

TRACE_VERSION = 1
TRACE_CHILDREN_KEY = "_trace_children"
SGLANG_TRACE_META_KEYS = (
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "queue_time",
    "e2e_latency",
    "decode_throughput",
)
# prefill/decode-disaggregation timings an engine may report: (meta key, child span name)
SGLANG_PD_PREFILL_SEGMENTS = tuple(
    (f"pd_prefill_{k}_duration", f"sglang_pd_prefill_{k}")
    for k in ("bootstrap_queue", "bootstrap", "alloc_wait", "forward", "transfer_queue")
)
SGLANG_PD_DECODE_SEGMENTS = tuple(
    (f"pd_decode_{k}_duration", f"sglang_pd_decode_{k}")
    for k in ("prealloc", "bootstrap", "alloc_wait", "transfer", "forward")
)
SGLANG_PD_SUMMARY_KEYS = ("pd_transfer_speed_gb_s", "pd_transfer_total_mb", "pd_prefill_retry_count")

logger = logging.getLogger(__name__)
# the open spans of this task/thread: (trace_id, span_id), innermost last
_SPANS: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar("slime_trace_spans", default=())
# the handles of each open span, innermost last (what an undecorated target falls back to)
_HANDLES: contextvars.ContextVar[tuple[tuple[TraceHandle, ...], ...]] = contextvars.ContextVar(
    "slime_trace_handles", default=()
)
_inferred_warned: set[str] = set()


@dataclass
class TraceHandle:
    """A reference to one trace carrier (a sample's `trace` dict, or a carrier of its own)."""

    trace_id: str
    carrier: dict[str, Any]
    sample_id: int | str | None = None
    group_id: int | str | None = None
    attempt: int = 0
    parent_span_id: str | None = None


@dataclass
class TraceSpanContext:
    """What `with trace_span(...) as span` gives: `span.set(key, value)` / `span.update(attrs)`
    add attributes to the span's end event (also after the span closed)."""

    target: Any
    handles: list[TraceHandle]
    span_records: list[tuple[TraceHandle, str]] = field(default_factory=list)
    start_ts: float = 0.0
    end_attrs: dict[str, Any] = field(default_factory=dict)
    end_events: list[dict[str, Any]] = field(default_factory=list)
    closed: bool = False

    def set(self, key: str, value: Any) -> TraceSpanContext:
        return self.update({key: value})

    def update(self, attrs: dict[str, Any] | None) -> TraceSpanContext:
        try:
            if attrs:
                plain = dict(attrs)
                children = plain.pop(TRACE_CHILDREN_KEY, None)
                self.end_attrs.update(plain)
                for event in self.end_events:
                    event.setdefault("attrs", {}).update(plain)
                if children:
                    _append_children(self.span_records, children, self.start_ts)
        except Exception as exc:  # noqa: BLE001 - tracing never breaks the traced code
            _skip("update", exc)
        return self

    set_attr = set
    update_attrs = update

    def build_end_attrs(self) -> dict[str, Any] | None:
        return dict(self.end_attrs) or None

    def finalize(self, end_events: list[dict[str, Any]]) -> None:
        self.end_events = end_events
        self.closed = True


def _skip(action: str, exc: Exception) -> None:
    logger.debug("trace %s skipped: %s", action, exc, exc_info=True)


def _new_id() -> str:
    return uuid.uuid4().hex


def _noop_handle(parent_span_id: str | None = None) -> TraceHandle:
    carrier = {"version": TRACE_VERSION, "trace_id": "", "events": [], "sample_id": None, "group_id": None}
    carrier["attempt"] = 0
    return TraceHandle(trace_id="", carrier=carrier, parent_span_id=parent_span_id)


def _ensure_carrier(
    carrier: dict[str, Any] | None,
    *,
    trace_id: str | None = None,
    sample_id: int | str | None = None,
    group_id: int | str | None = None,
    attempt: int = 0,
) -> dict[str, Any]:
    carrier = {} if carrier is None else carrier
    carrier.setdefault("version", TRACE_VERSION)
    carrier.setdefault("trace_id", trace_id or _new_id())
    carrier.setdefault("events", [])
    for key, value in (("sample_id", sample_id), ("group_id", group_id)):
        if value is not None:
            carrier[key] = value
        else:
            carrier.setdefault(key, None)
    carrier["attempt"] = int(carrier.get("attempt", attempt))
    return carrier


def _handle_of(carrier: dict[str, Any], parent_span_id: str | None = None) -> TraceHandle:
    return TraceHandle(
        trace_id=carrier["trace_id"],
        carrier=carrier,
        sample_id=carrier.get("sample_id"),
        group_id=carrier.get("group_id"),
        attempt=int(carrier.get("attempt", 0)),
        parent_span_id=parent_span_id,
    )


def bind_trace(sample: Sample) -> TraceHandle:
    """The sample's trace handle; gives the sample a carrier (`sample.trace`) on first use."""
    try:
        sample.trace = _ensure_carrier(
            getattr(sample, "trace", None), sample_id=sample.index, group_id=sample.group_index
        )
        return _handle_of(sample.trace)
    except Exception as exc:  # noqa: BLE001
        _skip("bind", exc)
        return _noop_handle()


def bind_trace_carrier(
    carrier: dict[str, Any] | None,
    *,
    trace_id: str | None = None,
    sample_id: int | str | None = None,
    group_id: int | str | None = None,
    attempt: int = 0,
    parent_span_id: str | None = None,
) -> TraceHandle:
    """A handle on `carrier` (a new one when None), filled in with the given ids."""
    try:
        trace = _ensure_carrier(carrier, trace_id=trace_id, sample_id=sample_id, group_id=group_id, attempt=attempt)
        return _handle_of(trace, parent_span_id)
    except Exception as exc:  # noqa: BLE001
        _skip("bind_carrier", exc)
        return _noop_handle(parent_span_id)


def export_trace(handle: TraceHandle) -> dict[str, Any]:
    """The ids another process needs to continue this trace (`import_trace` there)."""
    return {
        "version": TRACE_VERSION,
        "trace_id": handle.trace_id,
        "sample_id": handle.sample_id,
        "group_id": handle.group_id,
        "attempt": handle.attempt,
        "parent_span_id": handle.parent_span_id or _current_span_id(handle.trace_id),
    }


def import_trace(payload: dict[str, Any], carrier: dict[str, Any] | None = None) -> TraceHandle:
    """A handle continuing an exported trace: its spans become children of the exporter's span."""
    try:
        return bind_trace_carrier(
            carrier,
            trace_id=payload.get("trace_id"),
            sample_id=payload.get("sample_id"),
            group_id=payload.get("group_id"),
            attempt=int(payload.get("attempt", 0)),
            parent_span_id=payload.get("parent_span_id"),
        )
    except Exception as exc:  # noqa: BLE001
        _skip("import", exc)
        return _noop_handle()


def _append_event(
    handle: TraceHandle,
    kind: str,
    name: str,
    ts: float,
    *,
    attrs: dict[str, Any] | None = None,
    span_id: str | None = None,
    parent_span_id: str | None = None,
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": kind,
        "name": name,
        "ts": ts,
        "trace_id": handle.trace_id,
        "sample_id": handle.sample_id,
        "group_id": handle.group_id,
        "attempt": int(handle.carrier.get("attempt", handle.attempt)),
    }
    if span_id is not None:
        event["span_id"] = span_id
    if parent_span_id is not None:
        event["parent_span_id"] = parent_span_id
    if attrs:
        event["attrs"] = dict(attrs)
    handle.carrier["events"].append(event)
    return event


def _current_span_id(trace_id: str, stack: tuple[tuple[str, str], ...] | None = None) -> str | None:
    for tid, span_id in reversed(_SPANS.get() if stack is None else stack):
        if tid == trace_id:
            return span_id
    return None


def _is_sample_box(value: Any) -> bool:
    return type(value).__name__ == "SampleBox" and hasattr(value, "prompt_sample") and hasattr(value, "generation")


def _adapt(value: Any) -> Any:
    if isinstance(value, list):
        return [_adapt(v) for v in value]
    if _is_sample_box(value):
        return value.generation or value.prompt_sample
    return value


def _handles(target: Any) -> list[TraceHandle]:
    target = _adapt(target)
    if isinstance(target, TraceHandle):
        return [target]
    if isinstance(target, Sample):
        return [bind_trace(target)]
    if isinstance(target, list):
        return [h for item in target for h in _handles(item)]
    return []


def trace_event(target: Any, name: str, *, attrs: dict[str, Any] | None = None) -> None:
    """An instant event on each target's trace (a Sample, a TraceHandle or a list of them)."""
    try:
        ts = time.time()
        for h in _handles(target):
            parent = h.parent_span_id or _current_span_id(h.trace_id)
            _append_event(h, "event", name, ts, attrs=attrs, parent_span_id=parent)
    except Exception as exc:  # noqa: BLE001
        _skip(f"event:{name}", exc)


def _end_spans(records: list[tuple[TraceHandle, str]], name: str, attrs: dict[str, Any] | None) -> list[dict]:
    ts = time.time()
    return [_append_event(h, "span_end", name, ts, attrs=attrs, span_id=span_id) for h, span_id in records]


@contextmanager
def trace_span(target: Any, name: str, *, attrs: dict[str, Any] | None = None, record_error: bool = True):
    """A span around the block on each target's trace; yields a `TraceSpanContext` (the target
    itself when there is nothing to trace). An exception leaving the block is recorded on the
    span's end (`error_type`, `error_message`) with `record_error`, and re-raised."""
    try:
        handles = _handles(target)
    except Exception as exc:  # noqa: BLE001
        _skip(f"span:{name}", exc)
        handles = []
    if not handles:
        yield target
        return
    start = time.time()
    outer = _SPANS.get()
    records = []
    for h in handles:
        span_id = _new_id()
        parent = h.parent_span_id or _current_span_id(h.trace_id, outer)
        _append_event(h, "span_start", name, start, attrs=attrs, span_id=span_id, parent_span_id=parent)
        records.append((h, span_id))
    token = _SPANS.set(outer + tuple((h.trace_id, s) for h, s in records))
    handle_token = _HANDLES.set(_HANDLES.get() + (tuple(handles),))
    span = TraceSpanContext(
        target=handles[0] if len(handles) == 1 else handles, handles=handles, span_records=records, start_ts=start
    )
    try:
        yield span
    except Exception as exc:
        end_attrs = span.build_end_attrs() or {}
        if record_error:
            end_attrs.update(error_type=type(exc).__name__, error_message=str(exc))
        span.finalize(_end_spans(records, name, end_attrs or None))
        raise
    else:
        span.finalize(_end_spans(records, name, span.build_end_attrs()))
    finally:
        _SPANS.reset(token)
        _HANDLES.reset(handle_token)


def trace_next_attempt(target: Any, *, attrs: dict[str, Any] | None = None) -> Any:
    """Count one more attempt on each target's trace (a retried sample), with an `attempt_start`
    event; returns the handle(s)."""
    try:
        handles = _handles(target)
        for h in handles:
            h.attempt = h.carrier["attempt"] = int(h.carrier.get("attempt", 0)) + 1
            trace_event(h, "attempt_start", attrs={"attempt": h.attempt, **(attrs or {})})
        if not handles:
            return target
        return handles[0] if len(handles) == 1 else handles
    except Exception as exc:  # noqa: BLE001
        _skip("next_attempt", exc)
        return target


def _normalize_target(value: Any) -> Any:
    value = _adapt(value)
    if isinstance(value, (Sample, TraceHandle)):
        return value
    if isinstance(value, list) and value and all(_normalize_target(v) is not None for v in value):
        return value
    return None


def _resolve_target(fn: Callable, args: tuple, kwargs: dict, target: str | None, target_getter: Callable | None):
    qualname = getattr(fn, "__qualname__", repr(fn))
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs).arguments
    except Exception as exc:  # noqa: BLE001
        _skip(f"trace_function_bind:{qualname}", exc)
        bound = None
    if target is not None:
        resolved = _normalize_target(bound.get(target)) if bound is not None else None
        if resolved is None:
            logger.warning("trace_function target %r of %s is missing or not traceable; not traced", target, qualname)
        return resolved
    if target_getter is not None:
        try:
            return _normalize_target(target_getter(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001
            _skip(f"trace_function_target_getter:{qualname}", exc)
            return None
    for value in bound.values() if bound is not None else args:
        if (inferred := _normalize_target(value)) is not None:
            if qualname not in _inferred_warned:
                _inferred_warned.add(qualname)
                logger.warning("trace_function inferred the target of %s; prefer target=...", qualname)
            return inferred
    open_handles = _HANDLES.get()
    if open_handles and open_handles[-1]:
        current = list(open_handles[-1])
        return current[0] if len(current) == 1 else current
    return None


def _resolve_attrs(fn: Callable, args: tuple, kwargs: dict, attrs_getter: Callable | None) -> dict | None:
    if attrs_getter is None:
        return None
    try:
        attrs = attrs_getter(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        _skip(f"trace_function_attrs_getter:{getattr(fn, '__qualname__', fn)}", exc)
        return None
    if attrs is not None and not isinstance(attrs, dict):
        logger.warning("trace_function attrs_getter returned %s, not a dict; ignored", type(attrs).__name__)
        return None
    return attrs


def trace_function(
    name: str,
    *,
    target: str | None = None,
    target_getter: Callable[..., Any] | None = None,
    attrs_getter: Callable[..., dict[str, Any] | None] | None = None,
    record_error: bool = True,
):
    """Decorator: the whole call (sync or async) as one span on the target's trace. The target is
    the argument named `target`, else what `target_getter(*args, **kwargs)` returns, else the
    first traceable argument, else the innermost open span's target; none: not traced."""

    def decorator(fn):
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args, **kwargs):
                resolved = _resolve_target(fn, args, kwargs, target, target_getter)
                if resolved is None:
                    return await fn(*args, **kwargs)
                attrs = _resolve_attrs(fn, args, kwargs, attrs_getter)
                with trace_span(resolved, name, attrs=attrs, record_error=record_error):
                    return await fn(*args, **kwargs)

            return async_wrapper

        @functools.wraps(fn)
        def sync_wrapper(*args, **kwargs):
            resolved = _resolve_target(fn, args, kwargs, target, target_getter)
            if resolved is None:
                return fn(*args, **kwargs)
            attrs = _resolve_attrs(fn, args, kwargs, attrs_getter)
            with trace_span(resolved, name, attrs=attrs, record_error=record_error):
                return fn(*args, **kwargs)

        return sync_wrapper

    return decorator


def _append_children(parents: list[tuple[TraceHandle, str]], children: Any, parent_start: float) -> None:
    """Spans/events reported after the fact (offsets in seconds from the parent's start)."""
    for child in [children] if isinstance(children, dict) else children if isinstance(children, list) else []:
        if not isinstance(child, dict) or child.get("type") not in ("span", "event") or not child.get("name"):
            continue
        start = parent_start + float(child["start_offset"])
        attrs = child.get("attrs") if isinstance(child.get("attrs"), dict) else None
        if child["type"] == "event":
            for h, parent in parents:
                _append_event(h, "event", child["name"], start, attrs=attrs, parent_span_id=parent)
            continue
        end = parent_start + float(child["end_offset"])
        if end < start:
            continue
        records = []
        for h, parent in parents:
            span_id = _new_id()
            _append_event(h, "span_start", child["name"], start, span_id=span_id, parent_span_id=parent)
            records.append((h, span_id))
        _append_children(records, child.get("children"), start)
        for h, span_id in records:
            _append_event(h, "span_end", child["name"], end, attrs=attrs, span_id=span_id)


def _pd_children(meta: dict[str, Any]) -> list[dict[str, Any]]:
    children: list[dict[str, Any]] = []
    cursor = 0.0
    for phase, label, segments in (
        ("sglang_pd_prefill", "prefill", SGLANG_PD_PREFILL_SEGMENTS),
        ("sglang_pd_decode", "decode", SGLANG_PD_DECODE_SEGMENTS),
    ):
        parts, offset = [], 0.0
        for key, child_name in segments:
            duration = float(meta[key]) if meta.get(key) is not None else 0.0
            if duration > 0.0:
                parts.append(
                    {
                        "type": "span",
                        "name": child_name,
                        "start_offset": offset,
                        "end_offset": offset + duration,
                        "attrs": {key: meta[key]},
                    }
                )
                offset += duration
        if parts:
            children.append(
                {
                    "type": "span",
                    "name": phase,
                    "start_offset": cursor,
                    "end_offset": cursor + offset,
                    "attrs": {"phase": label, "duration_s": offset},
                    "children": parts,
                }
            )
            cursor += offset
    summary = {k: meta[k] for k in SGLANG_PD_SUMMARY_KEYS if meta.get(k) is not None}
    if summary:
        children.append({"type": "event", "name": "sglang_pd_summary", "start_offset": cursor, "attrs": summary})
    return children


def build_sglang_meta_trace_attrs(meta: dict[str, Any]) -> dict[str, Any]:
    """Span attributes from an engine response's `meta_info`: token counts, latencies, the finish
    reason, the request id, and prefill/decode timings as child spans."""
    attrs: dict[str, Any] = {}
    try:
        attrs.update({k: meta[k] for k in SGLANG_TRACE_META_KEYS if meta.get(k) is not None})
        reason = meta.get("finish_reason")
        if isinstance(reason, dict) and reason.get("type") is not None:
            attrs["finish_reason"] = reason["type"]
        elif reason is not None:
            attrs["finish_reason"] = reason
        if meta.get("id") is not None:
            attrs["sglang_request_id"] = meta["id"]
        if children := _pd_children(meta):
            attrs[TRACE_CHILDREN_KEY] = children
    except Exception as exc:  # noqa: BLE001
        _skip("sglang_meta_attrs", exc)
    return attrs
