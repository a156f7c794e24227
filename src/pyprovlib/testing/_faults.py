"""Fault injection and request accounting for the in-memory API server.

``ApiServer.faults`` fails or slows matching requests; ``ApiServer.requests`` counts every
request by (verb, resource) — failed and injected ones included — so tests can assert API-call
budgets and the User-Agent a client sends.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import TypedDict, Unpack

from pyprovlib.testing._status import ApiError

__all__ = ["Faults", "RequestMatch", "Requests"]

_MESSAGES = {
    409: "the object has been modified; please apply your changes to the latest version and "
    "try again",
    429: "Too many requests, please try again later.",
    500: "Internal error occurred: injected fault",
    503: "the server is currently unable to handle the request",
    504: "the server was unable to return a response in the time allotted",
}


class RequestMatch(TypedDict, total=False):
    """Which requests a fault applies to: every key given must match; none given matches
    every request.

    ``verb`` is the API verb (``get``, ``list``, ``watch``, ``create``, ``update``,
    ``patch``, ``delete``, ``deletecollection``), ``resource`` the plural with the
    subresource when there is one (``persistentvolumeclaims/status``), ``namespace`` and
    ``name`` the object's. ``count`` is how many matching requests the fault applies to;
    ``None`` means all of them, until :meth:`Faults.clear`.
    """

    verb: str | None
    resource: str | None
    namespace: str | None
    name: str | None
    count: int | None


@dataclass
class _Rule:
    verb: str | None
    resource: str | None
    namespace: str | None
    name: str | None
    remaining: int | None  # None: until cleared

    @staticmethod
    def fields(
        match: RequestMatch, count: int | None
    ) -> tuple[str | None, str | None, str | None, str | None, int | None]:
        """The rule's fields from ``match``, ``count`` when it names none."""
        return (
            match.get("verb"),
            match.get("resource"),
            match.get("namespace"),
            match.get("name"),
            match.get("count", count),
        )

    def matches(self, verb: str, resource: str, namespace: str | None, name: str | None) -> bool:
        return (
            (self.verb is None or self.verb == verb)
            and (self.resource is None or self.resource == resource)
            and (self.namespace is None or self.namespace == namespace)
            and (self.name is None or self.name == name)
            and (self.remaining is None or self.remaining > 0)
        )

    def consume(self) -> None:
        if self.remaining is not None:
            self.remaining -= 1


@dataclass
class _Failure(_Rule):
    status: int = 500
    retry_after: int | None = None
    applied: bool = False


@dataclass
class _Latency(_Rule):
    seconds: float = 0.0


class Faults:
    """Failures and latency to inject into the next matching requests."""

    def __init__(self) -> None:
        self._failures: list[_Failure] = []
        self._latencies: list[_Latency] = []

    def fail(
        self,
        status: int,
        *,
        retry_after: int | None = None,
        applied: bool = False,
        **match: Unpack[RequestMatch],
    ) -> None:
        """Answer the next ``count`` (default 1) requests that ``match`` with ``status`` and a
        real-looking ``Status`` body; 429/503 carry ``Retry-After`` when ``retry_after`` is
        given (429 defaults to 1 s).

        ``applied=True`` serves the request first and then answers with the failure: a write
        that took effect although its client was told otherwise, as a real API server's 504
        after etcd accepted the write, or an answer lost with its connection. Rules apply in
        the order they were added; the first that matches a request decides."""
        if status == 429 and retry_after is None:
            retry_after = 1
        self._failures.append(
            _Failure(
                *_Rule.fields(match, 1), status=status, retry_after=retry_after, applied=applied
            )
        )

    def latency(self, seconds: float, **match: Unpack[RequestMatch]) -> None:
        """Delay the requests that ``match`` by ``seconds`` (the next ``count``; by default
        all of them)."""
        self._latencies.append(_Latency(*_Rule.fields(match, None), seconds=seconds))

    def clear(self) -> None:
        """Remove every injected failure and latency."""
        self._failures.clear()
        self._latencies.clear()

    def take_failure(
        self, verb: str, resource: str, namespace: str | None, name: str | None
    ) -> tuple[ApiError, bool] | None:
        """The injected error for this request and whether the request is served before it
        is answered with the error, if a rule matches (consuming one use)."""
        for rule in self._failures:
            if rule.matches(verb, resource, namespace, name):
                rule.consume()
                self._failures = [r for r in self._failures if r.remaining != 0]
                return _error(rule, resource, name), rule.applied
        return None

    def take_latency(
        self, verb: str, resource: str, namespace: str | None, name: str | None
    ) -> float:
        """Seconds to wait before serving this request."""
        total = 0.0
        for rule in self._latencies:
            if rule.matches(verb, resource, namespace, name):
                rule.consume()
                total += rule.seconds
        self._latencies = [r for r in self._latencies if r.remaining != 0]
        return total


def _error(rule: _Failure, resource: str, name: str | None) -> ApiError:
    message = _MESSAGES.get(rule.status, f"injected failure with status {rule.status}")
    headers: dict[str, str] = {}
    details: dict[str, object] = {}
    plural, _, _sub = resource.partition("/")
    if name:
        details["name"] = name
    if plural:
        details["kind"] = plural
    if rule.status == 409 and name:
        message = f'Operation cannot be fulfilled on {plural} "{name}": {message}'
    if rule.retry_after is not None:
        headers["Retry-After"] = str(rule.retry_after)
        details["retryAfterSeconds"] = rule.retry_after
    return ApiError(rule.status, message, "", details or None, headers)


class Requests:
    """Counters of every request the server received, by (verb, resource)."""

    def __init__(self, keep_user_agents: int = 200) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()
        self._by_agent: Counter[tuple[str, str, str]] = Counter()
        self.user_agents: deque[str] = deque(maxlen=keep_user_agents)
        """User-Agent headers of the most recent resource requests, oldest first."""

    def record(self, verb: str, resource: str, user_agent: str) -> None:
        """Count one request."""
        self._counts[(verb, resource)] += 1
        self._by_agent[(user_agent, verb, resource)] += 1
        self.user_agents.append(user_agent)

    def count(self, verb: str | None = None, resource: str | None = None) -> int:
        """Requests matching ``verb`` and ``resource`` (``None`` matches any)."""
        return sum(
            n
            for (v, r), n in self._counts.items()
            if (verb is None or v == verb) and (resource is None or r == resource)
        )

    def snapshot(self, user_agent: str | None = None) -> dict[tuple[str, str], int]:
        """A copy of every counter; with ``user_agent``, of the requests that sent it only
        (e.g. what one process asked for, to check its RBAC)."""
        if user_agent is None:
            return dict(self._counts)
        return {(v, r): n for (a, v, r), n in self._by_agent.items() if a == user_agent}

    def reset(self) -> None:
        """Zero every counter and forget the user agents."""
        self._counts.clear()
        self._by_agent.clear()
        self.user_agents.clear()
