"""PromQL helpers shared by the deploy tests and the panel renderer: the metric contract, the
dashboard's queries with Grafana variables substituted, and a small top-level splitter used to
check that each operand of an alert's condition has data. Standard library only."""

import json
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
DEPLOY = os.path.dirname(HERE)
REPO = os.path.dirname(DEPLOY)
DASHBOARD = os.path.join(DEPLOY, "grafana", "pace.json")
RULES_DIR = os.path.join(DEPLOY, "prometheus", "rules")

# The server's metric contract (issue 4, item 5; docs/metrics.md). Every series carries
# model_name and scheduler.
HISTOGRAMS = [
    "pace_time_to_first_token_seconds", "pace_inter_token_latency_seconds", "pace_request_time_per_output_token_seconds",
    "pace_e2e_request_latency_seconds", "pace_user_idle_latency_seconds", "pace_request_queue_time_seconds",
    "pace_request_prompt_tokens", "pace_request_generation_tokens", "pace_step_duration_seconds",
    "pace_iteration_tokens_total", "pace_step_time_prediction_error_ratio", "pace_output_length_prediction_error_ratio",
    "pace_request_prefill_time_seconds", "pace_request_decode_time_seconds", "pace_request_inference_time_seconds",
    "pace_token_lateness_seconds",
]
GAUGES = [
    "pace_goodput_requests_per_second", "pace_goodput_tokens_per_second", "pace_smooth_goodput_per_second",
    "pace_slo_attainment_ratio", "pace_inflight_max_idle_latency_seconds", "pace_num_requests_running",
    "pace_num_requests_waiting", "pace_kv_cache_usage_perc", "process_resident_memory_bytes", "pace_cache_config_info",
]
COUNTERS = [
    "pace_requests_total", "pace_requests_rejected_total", "pace_num_preemptions_total", "pace_prompt_tokens_total",
    "pace_generation_tokens_total", "pace_http_requests_total", "pace_http_connections_refused_total",
    "pace_request_success_total", "pace_prefix_cache_queries_total", "pace_prefix_cache_hits_total",
    "pace_structured_output_masks_total", "pace_structured_output_mask_microseconds_total", "pace_structured_output_errors_total",
]
# Counters of events a short, light load may not cause; a server that registers its series lazily
# has no such series yet. The real-server e2e warns about these (fails with PACE_E2E_STRICT=1).
EVENT_COUNTERS = ["pace_requests_rejected_total", "pace_num_preemptions_total"]
# Histograms of events a short load may not cause either: the length prediction is scored only on
# requests that stopped by themselves (a load of short max_tokens may have none). Their series,
# what the rules record from them, and panels that read only those, are warnings unless strict.
EVENT_HISTOGRAMS = ["pace_output_length_prediction_error_ratio"]
# Structured outputs happen only when clients ask for them: a load without any leaves the
# mask-time panel empty (its ratio is kept to where masks were computed).
STRUCTURED_COUNTERS = ["pace_structured_output_masks_total", "pace_structured_output_mask_microseconds_total"]
EVENT_SERIES = {h + s for h in EVENT_HISTOGRAMS for s in ("_bucket", "_count", "_sum")} | {
    f"instance:{h}{s}:rate1m" for h in EVENT_HISTOGRAMS for s in ("_bucket", "_count", "_sum")} | set(STRUCTURED_COUNTERS)
CONTRACT = set(GAUGES) | set(COUNTERS) | {h + s for h in HISTOGRAMS for s in ("_bucket", "_count", "_sum")}
# smooth's own series (docs/metrics.md): only a server running smooth (with its door, the
# default) exports them, so they are checked on smooth's instances and are not part of the
# contract every scheduler meets.
SMOOTH_SERIES = {"pace_sustained_overload", "pace_door_returns_total"}

PROMQL_KEYWORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values", "group",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
    "rate", "irate", "increase", "delta", "idelta", "deriv", "histogram_quantile", "vector", "scalar", "abs",
    "clamp_min", "clamp_max", "min_over_time", "max_over_time", "avg_over_time", "sum_over_time", "absent",
    "label_replace", "label_join", "time", "timestamp", "le", "inf", "nan", "label_values", "query_result",
}


def load_dashboard(path=DASHBOARD):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def iter_panels(dash):
    """Every non-row panel, including panels nested in collapsed rows."""
    for p in dash.get("panels", []):
        if p.get("type") == "row":
            for q in p.get("panels", []):
                yield q
        else:
            yield p


def strip_strings(expr):
    """The expression with string literals emptied and comments removed (for name scanning)."""
    out, i, n = [], 0, len(expr)
    while i < n:
        c = expr[i]
        if c in "\"'`":
            j = i + 1
            while j < n and expr[j] != c:
                j += 2 if expr[j] == "\\" and c != "`" else 1
            out.append(c + c)
            i = j + 1
        elif c == "#":
            while i < n and expr[i] != "\n":
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def metric_names(expr):
    """Metric names a PromQL expression selects (identifiers that are not functions, keywords,
    label names inside braces or by/on lists, or durations)."""
    s = strip_strings(expr)
    s = re.sub(r"\{[^}]*\}", "{}", s)  # label matchers
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\[[^\]]*\]", "[]", s)  # range durations
    s = re.sub(r"\boffset\s+\S+", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])", s):
        tok = m.group(1)
        rest = s[m.end():].lstrip()
        if tok.lower() in PROMQL_KEYWORDS or rest.startswith("("):
            continue
        names.add(tok)
    return names


VAR_RE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)\]\]")
BUILTIN_VARS = {"__rate_interval", "__interval", "__range", "__range_s", "__range_ms", "__interval_ms", "__name",
                "__dashboard", "__from", "__to", "__user", "__org", "timeFilter", "__all"}


def variables_used(text):
    return {next(g for g in m.groups() if g) for m in VAR_RE.finditer(text)}


def substitute(text, values):
    """Grafana-style substitution of $var, ${var}, ${var:fmt} and [[var]] with values[var]."""
    def rep(m):
        name = next(g for g in m.groups() if g)
        if name not in values:
            raise KeyError(f"variable ${name} has no value in {sorted(values)}")
        return values[name]
    return VAR_RE.sub(rep, text)


def regex_escape(value):
    """A label value as Grafana's Prometheus datasource escapes it inside =~ (then in a PromQL string)."""
    return re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", value)


def dashboard_queries(dash, values, repeat_values=None):
    """(panel title, refId, expr) for every target of every panel, variables substituted.
    A panel with `repeat: VAR` is expanded once per value in repeat_values[VAR] (if given)."""
    out = []
    for p in iter_panels(dash):
        copies = [(values, values)]
        rv = p.get("repeat")
        if rv and repeat_values and repeat_values.get(rv):
            copies = [(dict(values, **{rv: regex_escape(v)}), dict(values, **{rv: v})) for v in repeat_values[rv]]
        for vals, raw in copies:
            for t in p.get("targets", []):
                out.append((substitute(p["title"], raw), t.get("refId", "?"), substitute(t["expr"], vals)))
    return out


def variable_query(var):
    """(selector, label) of a `label_values(selector, label)` / `label_values(label)` variable query."""
    q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
    m = re.fullmatch(r"\s*label_values\(\s*(?:(.*)\s*,\s*)?(\w+)\s*\)\s*", q, re.S)
    if not m:
        raise ValueError(f"variable {var['name']}: unsupported query {q!r} (expected label_values(...))")
    return (m.group(1) or "").strip() or None, m.group(2)


# --- top-level splitting of an alert condition ------------------------------------------------

_CMP = ["==", "!=", "<=", ">=", "<", ">"]


def _top_level_tokens(expr):
    """Yields (index, token) of binary set/comparison operators at paren/brace/bracket depth 0."""
    depth, i, n = 0, 0, len(expr)
    while i < n:
        c = expr[i]
        if c in "\"'`":
            j = i + 1
            while j < n and expr[j] != c:
                j += 2 if expr[j] == "\\" else 1
            i = j + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            two = expr[i:i + 2]
            if two in ("==", "!=", "<=", ">="):
                yield i, two
                i += 2
                continue
            if c in "<>":
                yield i, c
            else:
                m = re.match(r"(and|or|unless)\b", expr[i:])
                if m and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] in "_:")):
                    yield i, m.group(1)
                    i += len(m.group(1))
                    continue
        i += 1


def _strip_modifiers(part):
    """Removes a leading/trailing `on(...)`/`ignoring(...)`/`group_*(...)`/`bool` modifier."""
    part = part.strip()
    part = re.sub(r"^(bool\s+)?((on|ignoring)\s*\([^)]*\)\s*)?((group_left|group_right)\s*(\([^)]*\))?\s*)?", "", part)
    return part.strip()


def condition_operands(expr):
    """The vector operands of an alert condition: the expression split at top-level and/or/unless,
    each piece's comparison dropped (left side kept), offsets removed, numeric literals skipped.
    `A < 0.9 and on(x) B > 0` -> ["A", "B"]. Each operand should return data on a live system."""
    expr = re.sub(r"\boffset\s+\d+[smhdwy]", "", expr)
    cuts = [(i, op) for i, op in _top_level_tokens(expr) if op in ("and", "or", "unless")]
    pieces, last = [], 0
    for i, op in cuts:
        pieces.append(expr[last:i])
        last = i + len(op)
    pieces.append(expr[last:])
    out = []
    for piece in pieces:
        piece = _strip_modifiers(piece)
        cmps = [(i, op) for i, op in _top_level_tokens(piece) if op in _CMP]
        left = piece[:cmps[0][0]] if cmps else piece
        left = left.strip()
        if left and not re.fullmatch(r"[-+0-9.eE\s()*]+", left):
            out.append(left)
    return out
