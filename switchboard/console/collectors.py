"""The scrape-time collector: Redis-backed counters and gauges read from PostgreSQL.

Label values are capped at METRICS_MAX_QUEUES distinct queues (the busiest first); the rest are
reported together under ``__other__``: counts summed, a flag or a condition as how many of them
have it, the oldest pending age as the oldest of theirs. A value the collector cannot compute is
omitted, never reported as zero, and the failure is counted in
``switchboard_metrics_collection_errors_total{collector}``.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator

from django.conf import settings
from django.db.models import Count
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from admission import selectors as admission_selectors
from admission.limits import selectors as limits_selectors
from admission.models import AdmissionPolicy, DeferralReason
from queues import metrics, selectors
from queues.models import SweepRun, Todo, TodoState
from queues.selectors import QueueStat
from switchboard.core import availability, counters
from switchboard.ledger.models import LedgerCheck, LedgerHead

log = logging.getLogger(__name__)
OTHER = "__other__"
_errors: dict[str, int] = defaultdict(int)


class QueueLabels:
    """Maps queue names to label values, keeping at most ``cap`` distinct names."""

    def __init__(self, ranked: list[str] | None, cap: int) -> None:
        # None: no ranking could be read; keep names as they come rather than drop counters.
        self.kept = None if ranked is None else set(ranked[:cap])

    def __call__(self, queue: str) -> str:
        return queue if self.kept is None or queue in self.kept else OTHER


class SwitchboardCollector(Collector):
    def describe(self) -> list[CounterMetricFamily]:
        # Without describe(), registering would run a full collection (database reads) at import.
        return []

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:

        labels: QueueLabels | None = None
        stats = None
        database_down = False
        try:
            # Conditions need the budgets evaluated: filled apart, so a failed evaluation
            # leaves the counts standing.
            stats = selectors.queue_stats(with_conditions=False)
            ranked = sorted(stats, key=lambda s: (-sum(s.counts.values()), s.queue))
            labels = QueueLabels([s.queue for s in ranked], settings.METRICS_MAX_QUEUES)
        except Exception as exc:
            database_down = availability.is_outage(exc)
            log.exception("queue collector failed")
            _errors["queues"] += 1
        if labels is None:
            labels = QueueLabels(None, settings.METRICS_MAX_QUEUES)
        yield from self._counters(labels)
        if stats is not None:
            try:
                selectors.fill_conditions(stats, None)
            except Exception:
                log.exception("queue condition collector failed")
                _errors["conditions"] += 1
            yield from self._queue_gauges(stats, labels)
        if database_down:
            # The database just failed to answer: a second read would wait out its timeout
            # again, and /metrics must answer within seconds whatever is down.
            _errors["admission"] += 1
        else:
            yield from self._admission(labels)
            yield from self._limits()
            yield from self._ledger()
            yield from self._sweeps()
        errors = CounterMetricFamily(
            "switchboard_metrics_collection_errors",
            "Collector failures; the series they would have produced were omitted.",
            labels=["collector"],
        )
        for name in ("admission", "conditions", "counters", "ledger", "limits", "queues", "sweeps"):
            errors.add_metric([name], _errors[name])
        yield errors

    def _counters(self, labels: QueueLabels) -> Iterator[CounterMetricFamily]:

        for name, (doc, label_names) in metrics.COUNTERS.items():
            try:
                values = counters.read(name)
            except Exception:
                log.exception("counter %s unreadable", name)
                _errors["counters"] += 1
                continue
            family = CounterMetricFamily(name.removesuffix("_total"), doc, labels=list(label_names))
            merged: dict[tuple[str, ...], int] = defaultdict(int)
            for label_items, value in values.items():
                d = dict(label_items)
                if "queue" in d:
                    d["queue"] = labels(d["queue"])
                merged[tuple(d.get(n, "") for n in label_names)] += value
            for key, value in sorted(merged.items()):
                family.add_metric(list(key), value)
            yield family

    def _queue_gauges(
        self, stats: list[QueueStat], labels: QueueLabels
    ) -> Iterator[GaugeMetricFamily]:
        todos = GaugeMetricFamily(
            "switchboard_queue_todos", "Todos by queue and state.", labels=["queue", "state"]
        )
        oldest = GaugeMetricFamily(
            "switchboard_queue_oldest_pending_seconds",
            f"Age of the oldest pending todo (under {OTHER}: the oldest of its queues').",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "switchboard_queue_paused",
            f"1 when the queue is paused fleet-wide (under {OTHER}: how many of its queues are).",
            labels=["queue"],
        )
        condition = GaugeMetricFamily(
            "switchboard_queue_condition",
            "1 for each condition a queue is in (the words the console and the API use; under "
            f"{OTHER}: how many of its queues are in it).",
            labels=["queue", "condition"],
        )
        held: dict[tuple[str, str], int] = defaultdict(int)
        counts: dict[tuple[str, str], int] = defaultdict(int)
        ages: dict[str, float] = {}
        flags: dict[str, int] = {}
        for s in stats:
            q = labels(s.queue)
            for state, n in s.counts.items():
                counts[(q, state)] += n
            age = s.oldest_pending_seconds
            if age is not None:
                ages[q] = max(ages.get(q, 0.0), age)
            flags[q] = flags.get(q, 0) + (1 if s.paused else 0)
            for c in s.conditions:
                held[(q, str(c))] += 1
        for (q, state), n in sorted(counts.items()):
            todos.add_metric([q, state], n)
        for q, age in sorted(ages.items()):
            oldest.add_metric([q], age)
        for q, flag in sorted(flags.items()):
            paused.add_metric([q], flag)
        for (q, word), n in sorted(held.items()):
            condition.add_metric([q, word], n)
        yield todos
        yield oldest
        yield paused
        yield condition

    def _admission(self, labels: QueueLabels) -> Iterator[GaugeMetricFamily]:

        try:
            policies = list(AdmissionPolicy.objects.all())
            evaluations = admission_selectors.evaluate_policies(policies)
            pending = {
                (row["endpoint_id"], row["queue"]): row["n"]
                for row in Todo.objects.filter(state=TodoState.PENDING)
                .values("endpoint_id", "queue")
                .annotate(n=Count("id"))
            }
        except Exception:
            log.exception("admission collector failed")
            _errors["admission"] += 1
            return
        status_family = GaugeMetricFamily(
            "switchboard_admission_policies",
            "Admission policies by queue and status.",
            labels=["queue", "status"],
        )
        deferred_family = GaugeMetricFamily(
            "switchboard_admission_deferred_todos",
            "Pending todos held back by admission, by reason.",
            labels=["queue", "reason"],
        )
        statuses = ["admitted", *DeferralReason.values]
        by_status: dict[tuple[str, str], int] = defaultdict(int)
        by_reason: dict[tuple[str, str], int] = defaultdict(int)
        for p in policies:
            q = labels(p.queue)
            ev = evaluations[p.id]
            status = "admitted" if ev.admits else str(ev.reason)
            for s in statuses:
                by_status[(q, s)] += 0
            by_status[(q, status)] += 1
            for r in DeferralReason.values:
                by_reason[(q, r)] += 0
            if not ev.admits:
                by_reason[(q, str(ev.reason))] += pending.get((p.endpoint_id, p.queue), 0)
        for (q, s), n in sorted(by_status.items()):
            status_family.add_metric([q, s], n)
        for (q, r), n in sorted(by_reason.items()):
            deferred_family.add_metric([q, r], n)
        yield status_family
        yield deferred_family

    def _limits(self) -> Iterator[GaugeMetricFamily]:
        """Each declared pool's slots and claims held, each tag limit's claims held and each rate
        limit's effective limit, read from the same selector as ``limits status``. Limits are
        declared by operators, so their names are a small label set."""
        try:
            limits = limits_selectors.limits_status()
        except Exception:
            log.exception("limits collector failed")
            _errors["limits"] += 1
            return
        slots = GaugeMetricFamily(
            "switchboard_pool_slots", "A pool's slots (0: quarantined).", labels=["pool"]
        )
        pool_held = GaugeMetricFamily(
            "switchboard_pool_held", "Claims naming the pool now.", labels=["pool"]
        )
        tag_held = GaugeMetricFamily(
            "switchboard_tag_held", "Claims carrying the tag now.", labels=["tag"]
        )
        effective = GaugeMetricFamily(
            "switchboard_rate_effective_limit",
            "A rate limit's claims per minute now, after the 429s in its decay window.",
            labels=["rate_limit"],
        )
        for limit in limits:
            name = [limit["name"]]
            if limit["kind"] == "pool":
                slots.add_metric(name, limit["slots"])
                pool_held.add_metric(name, limit["held"])
            elif limit["kind"] == "tag":
                tag_held.add_metric(name, limit["held"])
            elif "effective_limit" in limit:
                effective.add_metric(name, limit["effective_limit"])
        yield slots
        yield pool_held
        yield tag_held
        yield effective

    def _sweeps(self) -> Iterator[GaugeMetricFamily]:
        """When each beat sweep last finished: a worker or beat that stopped is a timestamp
        that stops moving (alert on ``time() - it > 3 * SWEEP_INTERVAL_SECONDS``)."""
        try:
            runs = list(SweepRun.objects.values_list("name", "finished_at"))
        except Exception:
            log.exception("sweep collector failed")
            _errors["sweeps"] += 1
            return
        finished = GaugeMetricFamily(
            "switchboard_sweep_finished_timestamp_seconds",
            "When a beat sweep last finished (Unix time).",
            labels=["sweep"],
        )
        for name, at in runs:
            finished.add_metric([name], at.timestamp())
        yield finished

    def _ledger(self) -> Iterator[GaugeMetricFamily]:
        """Each chain's signed head position, read live (a scrape history outside the database:
        a position that ever goes down was rolled back, which the database alone cannot prove),
        and the last stored check's verdict and time."""
        try:
            heads = list(LedgerHead.objects.order_by("id").values_list("id", "chain_pos"))
            stored = LedgerCheck.objects.filter(pk=1).values_list("ok", "checked_at").first()
        except Exception:
            log.exception("ledger collector failed")
            _errors["ledger"] += 1
            return
        position = GaugeMetricFamily(
            "switchboard_ledger_head_position",
            "A ledger chain's signed head: its rows. It only ever rises; a fall is a rollback.",
            labels=["chain"],
        )
        for chain, chain_pos in heads:
            position.add_metric([str(chain)], chain_pos)
        yield position
        if stored is not None:
            ok, checked_at = stored
            yield GaugeMetricFamily(
                "switchboard_ledger_check_ok", "The last ledger check: 1 sound, 0 broken.", ok
            )
            yield GaugeMetricFamily(
                "switchboard_ledger_checked_timestamp_seconds",
                "When the last ledger check ran (Unix time).",
                checked_at.timestamp(),
            )
