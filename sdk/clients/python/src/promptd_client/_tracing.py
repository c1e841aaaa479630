"""The caller's OpenTelemetry trace context on every request, when OpenTelemetry is there.

The daemon reads the W3C ``traceparent`` (and ``tracestate``) headers and puts its spans in
the caller's trace. The client has no dependency on OpenTelemetry: the first request tries to
import ``opentelemetry.propagate`` once (the result is kept, so later requests only check a
module global); without it, or while no span is active (an invalid context makes the
propagators write nothing), no header is added.
"""

from __future__ import annotations

from typing import Any, Dict, MutableMapping

_UNSET: Any = object()
#: ``opentelemetry.propagate`` once imported, ``None`` when it cannot be, ``_UNSET`` before the
#: first try.
_propagate: Any = _UNSET


def _propagator_module() -> Any:
    global _propagate
    if _propagate is _UNSET:
        try:
            from opentelemetry import propagate  # type: ignore[import-not-found]
        except Exception:  # not installed, or its import fails (a bad OTEL_PROPAGATORS)
            propagate = None
        _propagate = propagate
    return _propagate


def inject(headers: MutableMapping[str, str]) -> None:
    """Adds what the globally configured propagator (by default W3C trace context and
    baggage) writes for the current context to ``headers``, without replacing the client's
    own headers. Tracing never fails a request: a propagator's error is ignored."""
    propagate = _propagator_module()
    if propagate is None:
        return
    carrier: Dict[str, str] = {}
    try:
        propagate.inject(carrier)
    except Exception:
        return
    own = {k.lower() for k in headers}
    for key, value in carrier.items():
        if key.lower() not in own:
            headers[key] = value
