"""The PromQL of the Grafana dashboards in charts/longhaul/dashboards, the metric names the
project exports (fixed in the shared naming contract; the worker and operator must export exactly
these), and the series the chart's recording rules (templates/prometheusrule.yaml) record. Used by
chart_test.py (static checks) and prometheus_scrape_test.py (live queries).
"""

from __future__ import annotations

import json
import pathlib
import re
from dataclasses import dataclass

REPO = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "charts" / "longhaul" / "dashboards"
RULE_TEMPLATE = REPO / "charts" / "longhaul" / "templates" / "prometheusrule.yaml"

WORKER_COUNTERS = {
    "longhaul_train_steps_total",
    "longhaul_train_tokens_total",
    "longhaul_checkpoint_written_bytes_total",
    "longhaul_checkpoint_saves_total",
    "longhaul_checkpoint_restores_total",
    "longhaul_train_skipped_steps_total",
    "longhaul_worker_regroups_total",
}
WORKER_GAUGES = {
    "longhaul_train_global_step",
    "longhaul_train_loss",
    "longhaul_train_learning_rate",
    "longhaul_train_grad_norm",
    "longhaul_train_tokens_per_second",
    "longhaul_train_max_steps",
    "longhaul_checkpoint_last_step",
    "longhaul_checkpoint_last_timestamp_seconds",
    "longhaul_checkpoint_last_bytes",
    "longhaul_worker_is_chief",
    "longhaul_worker_build_info",
    "longhaul_worker_start_time_seconds",
    "longhaul_train_last_step_timestamp_seconds",
}
WORKER_HISTOGRAMS = {
    "longhaul_train_step_duration_seconds",
    "longhaul_checkpoint_duration_seconds",
    "longhaul_checkpoint_stall_seconds",
    "longhaul_worker_regroup_duration_seconds",
}
OPERATOR_COUNTERS = {
    "longhaul_operator_reconciles_total",
    "longhaul_operator_pod_restarts_total",
    "longhaul_operator_api_requests_total",
}
OPERATOR_GAUGES = {
    "longhaul_operator_jobs",
    "longhaul_operator_workqueue_depth",
    "longhaul_operator_is_leader",
    "longhaul_operator_build_info",
    # Per unfinished job (labels namespace, name; trainingjob after the ServiceMonitor).
    "longhaul_operator_job_failures",
    "longhaul_operator_job_backoff_limit",
}
OPERATOR_HISTOGRAMS = {
    "longhaul_operator_reconcile_duration_seconds",
    "longhaul_operator_workqueue_latency_seconds",
    "longhaul_operator_recovery_seconds",
    "longhaul_operator_reconcile_cpu_seconds",
    "longhaul_operator_api_request_duration_seconds",
}


def _series_names(counters: set[str], gauges: set[str], histograms: set[str]) -> set[str]:
    names = set(counters) | set(gauges)
    for h in histograms:
        names |= {h + "_bucket", h + "_sum", h + "_count"}
    return names


WORKER_SERIES = _series_names(WORKER_COUNTERS, WORKER_GAUGES, WORKER_HISTOGRAMS)
OPERATOR_SERIES = _series_names(OPERATOR_COUNTERS, OPERATOR_GAUGES, OPERATOR_HISTOGRAMS)
ALL_SERIES = WORKER_SERIES | OPERATOR_SERIES
# The recording rules' outputs (level:metric:operations), read off the template.
RECORDED_SERIES = set(re.findall(r"^\s*- record: (\S+)\s*$", RULE_TEMPLATE.read_text(), re.M))

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
             "group_left", "group_right", "inf", "nan", "atan2"}
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.*?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")


def metric_names(expr: str) -> set[str]:
    """Every metric name an instant/range PromQL expression selects (not functions, labels,
    keywords or Grafana variables). label_values(<selector>, <label>) is unwrapped."""
    m = _LABEL_VALUES.match(expr)
    if m:
        expr = m.group(1)
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals (label values, regexes)
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range and subquery durations
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for tok in re.finditer(r"\$?[A-Za-z_:][A-Za-z0-9_:]*", s):
        word = tok.group(0)
        if word.startswith("$") or word.lower() in _KEYWORDS:
            continue
        rest = s[tok.end():].lstrip()
        if rest.startswith("("):  # a function call
            continue
        before = s[: tok.start()]
        if re.search(r"[0-9.]$", before):  # exponent or duration suffix of a number
            continue
        names.add(word)
    return names


@dataclass(frozen=True)
class Query:
    dashboard: str  # file name
    where: str  # panel title or variable name
    expr: str
    is_variable: bool


def load_dashboards(directory: pathlib.Path = DASHBOARD_DIR) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def _panels(panels: list[dict]):
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def queries(dashboards: dict[str, dict]) -> list[Query]:
    out = []
    for name, dash in dashboards.items():
        for var in dash.get("templating", {}).get("list", []):
            if var.get("type") == "query":
                q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
                out.append(Query(name, "variable " + var["name"], q, True))
        for panel in _panels(dash.get("panels", [])):
            for target in panel.get("targets", []):
                out.append(Query(name, panel["title"], target["expr"], False))
    return out


def substitute(expr: str, range_: str = "1m", rate_interval: str = "15s") -> str:
    """The expression as Grafana sends it with every variable at "All" (regex .*)."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("$__range", range_)
    expr = expr.replace("$__interval", rate_interval)
    return re.sub(r"\$[A-Za-z_][A-Za-z0-9_]*", ".*", expr)
