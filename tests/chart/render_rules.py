#!/usr/bin/env python3
"""Renders the chart's PrometheusRule (templates/prometheusrule.yaml) with Helm's own engine and
prints its spec as a Prometheus rule file (what the Prometheus Operator hands to Prometheus), for
promtool and for a real Prometheus. Needs the project's test venv (helm-python-sdk, pyyaml).

  <venv>/bin/python tests/chart/render_rules.py [--values JSON] [--release longhaul]
                                [--namespace longhaul-system] [--format yaml|json] > rules.yaml

(JSON is YAML: Prometheus loads either; the scrape test reads JSON with the standard library.)

The values always turn prometheusRule on; without --values the rest are the chart's defaults
plus metrics.serviceMonitor.enabled (LonghaulOperatorDown is rendered only with it).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import yaml

import helm_python as helm

CHART = pathlib.Path(__file__).resolve().parents[2] / "charts" / "longhaul"
DEFAULT_VALUES = {"prometheusRule": {"enabled": True},
                  "metrics": {"serviceMonitor": {"enabled": True}}}


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def prometheus_rule(values: dict | None = None, release: str = "longhaul",
                    namespace: str = "longhaul-system") -> dict:
    """The rendered PrometheusRule object; `values` are merged over DEFAULT_VALUES."""
    values = merge(DEFAULT_VALUES, values or {})
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values=values, name=release, namespace=namespace,
                                 is_install=True)
    text = manifests.get("longhaul/templates/prometheusrule.yaml", "")
    rule = yaml.safe_load(text) if text.strip() else None
    if not rule:
        raise SystemExit("templates/prometheusrule.yaml rendered nothing with " + json.dumps(values))
    return rule


class _BlockDumper(yaml.SafeDumper):
    """Multi-line expressions as `|` blocks, as in the template, so a failure shows them readably."""


_BlockDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def rule_file(values: dict | None = None, release: str = "longhaul",
              namespace: str = "longhaul-system", fmt: str = "yaml") -> str:
    """The PrometheusRule's spec as a Prometheus rule file, in YAML or JSON."""
    spec = prometheus_rule(values, release, namespace)["spec"]
    if fmt == "json":
        return json.dumps(spec, indent=1)
    return yaml.dump(spec, Dumper=_BlockDumper, sort_keys=False, width=200)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--values", default="{}", help="JSON merged over the defaults")
    parser.add_argument("--release", default="longhaul")
    parser.add_argument("--namespace", default="longhaul-system")
    parser.add_argument("--format", choices=["yaml", "json"], default="yaml")
    args = parser.parse_args()
    sys.stdout.write(rule_file(json.loads(args.values), args.release, args.namespace, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
