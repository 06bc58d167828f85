"""The Helm chart (helm/specd), checked without a Kubernetes cluster:

- `helm lint --strict` and `helm template` for a matrix of values (CPU, GPU with TP 2, TLS,
  monitoring on and off, a self draft, no draft, a model PVC, API keys), and values the
  schema refuses;
- every rendered manifest against the Kubernetes 1.33 schemas (kubernetes-validate --strict);
  the Prometheus-operator kinds, which those schemas lack, by hand and with promtool;
- every container has probes (main containers), requests and limits and a non-root, read-only,
  no-escalation, no-capability security context; selectors match labels, Service target ports
  and probe ports name real container ports, the router dials real Services, volumes exist;
- the router, draft and target command lines **taken from the rendered chart** started as
  processes on loopback (only the Services' DNS names become 127.0.0.1): they pass their
  health probes and answer a prompt over gRPC and HTTP, and a flag the binaries do not accept
  fails;
- cell.layout=pod: one pod per cell (replicas, an HPA, a PodMonitor, a NetworkPolicy that
  leaves only the router's ports open), its containers' command lines run on loopback as the
  pod would (the router dials localhost) and answer;
- a real Prometheus (Debian's) scrapes that cluster with deploy/prometheus.yml under load:
  every Grafana dashboard query and every alert rule's signal returns series, every rule
  evaluates without error (monitoring/).

Usage: helm_chart_test.py BUILD_DIR  (ctest: helm_chart_test; needs SPECD_TOOLS_BIN with helm,
SPECD_PYTHON's venv with kubernetes-validate and PyYAML, and prometheus/promtool on PATH)
"""
import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

import kubernetes_validate
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHART = os.path.join(ROOT, "helm", "specd")
BUILD = None
HELM = None
K8S_VERSION = "1.33.0"
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule", "PodMonitor"}

# The values matrix: name -> --set arguments.
MATRIX = {
    "cpu-default": [],
    "monitoring-on": ["monitoring.serviceMonitor.enabled=true",
                      "monitoring.prometheusRule.enabled=true",
                      "monitoring.grafanaDashboard.enabled=true"],
    "gpu-tp2": ["target.gpu.enabled=true", "target.worldSize=2", "model.existingClaim=models"],
    "tls-on": ["tls.enabled=true", "tls.routerSecret=router-tls", "tls.draftSecret=draft-tls",
               "tls.targetSecret=target-tls", "monitoring.serviceMonitor.enabled=true"],
    "self-draft-api-keys": ["draft.model=self", "draft.layers=6", "router.apiKeysSecret=keys",
                            "router.maxRunning=16", "networkPolicy.enabled=false"],
    "no-draft": ["draft.enabled=false", "podDisruptionBudget.enabled=false"],
    # One pod per cell, replicated: behind one router Service, TLS only on its public face.
    "pod-cells": ["cell.layout=pod", "cell.replicas=3", "monitoring.serviceMonitor.enabled=true",
                  "tls.enabled=true", "tls.routerSecret=router-tls"],
    "pod-cells-hpa-tp3": ["cell.layout=pod", "autoscaling.enabled=true", "target.worldSize=3",
                          "draft.model=self"],
}


def run(cmd, ok=True, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if ok and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}"
                             f"\n{p.stderr[-3000:]}")
    return p


def helm_template(sets, release="cell"):
    args = [HELM, "template", release, CHART, "--namespace", "llm"]
    for s in sets:
        args += ["--set", s]
    out = run(args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def workloads(docs):
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def container_ports(workload):
    ports = {}
    for c in workload["spec"]["template"]["spec"]["containers"]:
        for p in c.get("ports", []):
            ports[p["name"]] = p["containerPort"]
    return ports


def router_container(workload):
    """The workload's router container, or None."""
    return next((c for c in workload["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "router"), None)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ChartRenderTest(unittest.TestCase):
    """Lint, render, validate and cross-check the chart for every values set."""

    @classmethod
    def setUpClass(cls):
        cls.rendered = {name: helm_template(sets) for name, sets in MATRIX.items()}

    def test_lint_strict_for_every_values_set(self):
        for name, sets in MATRIX.items():
            args = [HELM, "lint", "--strict", CHART]
            for s in sets:
                args += ["--set", s]
            with self.subTest(values=name):
                p = run(args, ok=False)
                self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
                self.assertIn("0 chart(s) failed", p.stdout)

    def test_schema_refuses_bad_values(self):
        bad = {"target.worldSize=0": "worldSize", "router.grpcPort=70000": "grpcPort",
               "router.extraArgs[0]=oops": "extraArgs", "image.pullPolicy=Sometimes": "pullPolicy",
               "model.fetch.sha256=abc": "sha256", "router.nosuchvalue=1": "nosuchvalue",
               "cell.layout=sideways": "layout", "cell.replicas=0": "replicas",
               "router.stepMsWhileDecoding=-1": "stepMsWhileDecoding",
               # an HPA scales pod cells; the services layout has one router per release
               "autoscaling.enabled=true": "autoscaling.enabled"}
        for s, field in bad.items():
            with self.subTest(value=s):
                p = run([HELM, "template", "x", CHART, "--set", s], ok=False)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn(field, p.stderr)
        p = run([HELM, "template", "x", CHART, "--set", "tls.enabled=true"], ok=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertRegex(p.stderr, r"tls\.\w+Secret is required when tls.enabled")

    def test_manifests_valid_against_kubernetes_schemas(self):
        for name, docs in self.rendered.items():
            for d in docs:
                with self.subTest(values=name, kind=d["kind"], name=d["metadata"]["name"]):
                    if d["kind"] in OPERATOR_KINDS:
                        self.assertEqual(d["apiVersion"], "monitoring.coreos.com/v1")
                        continue
                    # Raises on an invalid or unknown resource; strict: no unexpected fields.
                    kubernetes_validate.validate(d, K8S_VERSION, strict=True)

    def test_every_container_is_hardened_with_probes_and_limits(self):
        for name, docs in self.rendered.items():
            for w in workloads(docs):
                pod = w["spec"]["template"]["spec"]
                self.assertTrue(pod["securityContext"]["runAsNonRoot"])
                self.assertGreater(pod["securityContext"]["runAsUser"], 0)
                self.assertFalse(pod["automountServiceAccountToken"])
                volumes = {v["name"] for v in pod["volumes"]}
                for kind in ("initContainers", "containers"):
                    for c in pod.get(kind, []):
                        with self.subTest(values=name, workload=w["metadata"]["name"],
                                          container=c["name"]):
                            sc = c["securityContext"]
                            self.assertFalse(sc["allowPrivilegeEscalation"])
                            self.assertTrue(sc["readOnlyRootFilesystem"])
                            self.assertTrue(sc["runAsNonRoot"])
                            self.assertEqual(sc["capabilities"]["drop"], ["ALL"])
                            for part in ("requests", "limits"):
                                self.assertIn("cpu", c["resources"][part])
                                self.assertIn("memory", c["resources"][part])
                            for m in c.get("volumeMounts", []):
                                self.assertIn(m["name"], volumes)
                            if kind == "containers" and c["name"].startswith("target-rank-"):
                                # A rank process serves nothing: rank 0 watches it (a rank
                                # that dies or hangs takes the group down, and it restarts).
                                self.assertIn("--rendezvous=127.0.0.1:29500", c["args"])
                                self.assertNotIn("ports", c)
                            elif kind == "containers":
                                ports = {p["containerPort"] for p in c["ports"]}
                                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                                    self.assertIn(probe, c)
                                    self.assertIn(self.probe_port(c[probe]), ports)

    def probe_port(self, probe):
        if "grpc" in probe:
            return probe["grpc"]["port"]
        if "tcpSocket" in probe:
            return probe["tcpSocket"]["port"]
        cmd = probe["exec"]["command"]
        self.assertEqual(cmd[1:3], ["client", "health"])
        self.assertIn("--tls-ca", cmd)  # exec probes exist for TLS only
        return int(cmd[cmd.index("--server") + 1].rsplit(":", 1)[1])

    def test_selectors_ports_and_addresses_agree(self):
        for name, docs in self.rendered.items():
            ws = workloads(docs)
            for w in ws:
                with self.subTest(values=name, workload=w["metadata"]["name"]):
                    self.assertTrue(matches(w["spec"]["selector"]["matchLabels"],
                                            w["spec"]["template"]["metadata"]["labels"]))
            services = {}
            for s in by_kind(docs, "Service"):
                with self.subTest(values=name, service=s["metadata"]["name"]):
                    backing = [w for w in ws if matches(s["spec"]["selector"],
                                                        w["spec"]["template"]["metadata"]["labels"])]
                    self.assertEqual(len(backing), 1, "a Service selects exactly one workload")
                    ports = container_ports(backing[0])
                    for p in s["spec"]["ports"]:
                        self.assertIn(p.get("targetPort", p["port"]), ports)
                        services[(s["metadata"]["name"], p["port"])] = ports[p["targetPort"]]
            for sts in by_kind(docs, "StatefulSet"):
                self.assertIn((sts["spec"]["serviceName"], container_ports(sts)["grpc"]), services)
            router = next(w for w in ws if router_container(w))
            args = router_container(router)["args"]
            dials = [a.split("=", 1)[1] for a in args if a.startswith(("--target=", "--draft="))]
            self.assertEqual(len(dials), 1 if "no-draft" in name else 2)
            for address in dials:
                host, port = address.rsplit(":", 1)
                if host == "localhost":  # a pod cell: a container beside the router
                    self.assertIn(int(port), container_ports(router).values(), address)
                else:
                    self.assertIn((host, int(port)), services, f"the router dials {address}")
            for kind in ("PodDisruptionBudget",):
                for pdb in by_kind(docs, kind):
                    self.assertEqual(sum(matches(pdb["spec"]["selector"]["matchLabels"],
                                                 w["spec"]["template"]["metadata"]["labels"])
                                         for w in ws), 1)

    def test_network_policy_lets_only_the_router_reach_draft_and_target(self):
        docs = self.rendered["cpu-default"]
        ws = workloads(docs)
        router = next(w for w in ws if w["metadata"]["name"].endswith("-router"))
        policies = by_kind(docs, "NetworkPolicy")
        self.assertEqual(len(policies), 2)
        for np in policies:
            guarded = [w for w in ws if matches(np["spec"]["podSelector"]["matchLabels"],
                                                w["spec"]["template"]["metadata"]["labels"])]
            self.assertEqual(len(guarded), 1)
            self.assertNotEqual(guarded[0], router)
            ports = container_ports(guarded[0])
            grpc_rule = next(r for r in np["spec"]["ingress"]
                             if r["ports"][0]["port"] == ports["grpc"])
            self.assertEqual(len(grpc_rule["from"]), 1)
            self.assertTrue(matches(grpc_rule["from"][0]["podSelector"]["matchLabels"],
                                    router["spec"]["template"]["metadata"]["labels"]))
            # Nothing else opens the gRPC port: the other rule is the metrics port only.
            others = [r for r in np["spec"]["ingress"] if r is not grpc_rule]
            self.assertEqual([r["ports"][0]["port"] for r in others], [ports["metrics"]])
        self.assertEqual(by_kind(self.rendered["self-draft-api-keys"], "NetworkPolicy"), [])
        # A pod cell: from outside the pod, the router's API and the metrics ports only.
        for name in ("pod-cells", "pod-cells-hpa-tp3"):
            docs = self.rendered[name]
            [cell] = workloads(docs)
            [np] = by_kind(docs, "NetworkPolicy")
            self.assertTrue(matches(np["spec"]["podSelector"]["matchLabels"],
                                    cell["spec"]["template"]["metadata"]["labels"]))
            ports = container_ports(cell)
            opened = {p["port"] for r in np["spec"]["ingress"] for p in r["ports"]}
            want = {ports[n] for n in ports if n in ("grpc", "http") or n.endswith("metrics")}
            self.assertEqual(opened, want, name)
            self.assertNotIn(ports["target-grpc"], opened)

    def test_monitoring_resources(self):
        self.assertFalse([d for d in self.rendered["cpu-default"] if d["kind"] in OPERATOR_KINDS])
        docs = self.rendered["monitoring-on"]
        sm = by_kind(docs, "ServiceMonitor")[0]
        selected = [s for s in by_kind(docs, "Service")
                    if matches(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
                    and s["metadata"]["labels"]["app.kubernetes.io/component"]
                    in sm["spec"]["selector"]["matchExpressions"][0]["values"]
                    and "metrics" in [p["name"] for p in s["spec"]["ports"]]]
        self.assertEqual(sorted(s["metadata"]["name"] for s in selected),
                         ["cell-specd-draft", "cell-specd-router", "cell-specd-target"])
        self.assertEqual(sm["spec"]["endpoints"][0]["port"], "metrics")
        # A pod cell: one PodMonitor, every port a metrics port of the cell pod, each scraped
        # under the job name the alert rules match (<fullname>-router|draft|target).
        pod_docs = self.rendered["pod-cells"]
        self.assertEqual(by_kind(pod_docs, "ServiceMonitor"), [])
        [pm] = by_kind(pod_docs, "PodMonitor")
        [cell] = workloads(pod_docs)
        self.assertTrue(matches(pm["spec"]["selector"]["matchLabels"],
                                cell["spec"]["template"]["metadata"]["labels"]))
        jobs = {}
        for e in pm["spec"]["podMetricsEndpoints"]:
            self.assertIn(e["port"], container_ports(cell))
            self.assertTrue(e["port"].endswith("metrics"))
            jobs[e["port"]] = e["relabelings"][0]["replacement"]
        self.assertEqual(jobs, {"metrics": "cell-specd-router", "draft-metrics": "cell-specd-draft",
                                "target-metrics": "cell-specd-target"})
        rule = by_kind(docs, "PrometheusRule")[0]
        with open(os.path.join(CHART, "files", "alerts.yaml")) as f:
            self.assertEqual(rule["spec"], yaml.safe_load(f))
        alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
        self.assertTrue({"SpecdTargetDown", "SpecdErrorRate", "SpecdQueueSaturated",
                         "SpecdKvExhausted", "SpecdAcceptanceCollapse"} <= alerts)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump(rule["spec"], f)
            f.flush()
            p = run(["promtool", "check", "rules", f.name], ok=False)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        dash = next(d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard"))
        self.assertEqual(dash["metadata"]["labels"]["grafana_dashboard"], "1")
        with open(os.path.join(CHART, "files", "grafana-dashboard.json")) as f:
            self.assertEqual(json.loads(dash["data"]["specd.json"]), json.load(f))

    def test_gpu_and_tls_values(self):
        gpu = self.rendered["gpu-tp2"]
        target = next(w for w in by_kind(gpu, "StatefulSet"))
        containers = target["spec"]["template"]["spec"]["containers"]
        # One rank process per container, one GPU each, meeting at rank 0's rendezvous.
        self.assertEqual([c["name"] for c in containers], ["target", "target-rank-1"])
        for rank, c in enumerate(containers):
            self.assertEqual(c["resources"]["limits"]["nvidia.com/gpu"], 1)
            self.assertTrue(c["image"].endswith("-cuda"))
            self.assertIn("--world-size=2", c["args"])
            self.assertIn(f"--rank={rank}", c["args"])
        threads = helm_template(["target.gpu.enabled=true", "target.worldSize=2",
                                 "target.tensorParallel=threads"])
        c = by_kind(threads, "StatefulSet")[0]["spec"]["template"]["spec"]["containers"]
        self.assertEqual(len(c), 1)
        self.assertEqual(c[0]["resources"]["limits"]["nvidia.com/gpu"], 2)
        self.assertFalse([a for a in c[0]["args"] if a.startswith("--rank")])
        self.assertNotIn("initContainers", target["spec"]["template"]["spec"])
        self.assertEqual(target["spec"]["template"]["spec"]["volumes"][0]
                         ["persistentVolumeClaim"]["claimName"], "models")
        tls = self.rendered["tls-on"]
        for w in workloads(tls):
            c = w["spec"]["template"]["spec"]["containers"][0]
            self.assertIn("exec", c["readinessProbe"])
            secrets = [v["secret"]["secretName"] for v in w["spec"]["template"]["spec"]["volumes"]
                       if "secret" in v]
            self.assertEqual(len(secrets), 1)
            if not w["metadata"]["name"].endswith("-router"):
                names = next(a for a in c["args"] if a.startswith("--tls-client-names="))
                self.assertEqual(names.split("=", 1)[1].split(","),
                                 ["specd-router", w["metadata"]["name"]])
        # A pod cell with TLS: the router's public face speaks TLS; the draft and target
        # serve it in plaintext on the pod's loopback (probed by the kubelet's gRPC probe).
        [cell] = workloads(self.rendered["pod-cells"])
        containers = {c["name"]: c for c in cell["spec"]["template"]["spec"]["containers"]}
        self.assertEqual(sorted(containers), ["draft", "router", "target"])
        self.assertIn("--tls-cert=/etc/specd/tls/tls.crt", containers["router"]["args"])
        self.assertIn("exec", containers["router"]["readinessProbe"])
        self.assertFalse([a for a in containers["router"]["args"] if a.startswith("--upstream")])
        for worker in ("draft", "target"):
            self.assertFalse([a for a in containers[worker]["args"] if a.startswith("--tls")])
            self.assertIn("grpc", containers[worker]["readinessProbe"])
        self.assertEqual(cell["spec"]["replicas"], 3)

    def test_pod_cells_scale_with_an_hpa(self):
        docs = self.rendered["pod-cells-hpa-tp3"]
        [cell] = workloads(docs)
        self.assertNotIn("replicas", cell["spec"])  # the HPA owns it
        [hpa] = by_kind(docs, "HorizontalPodAutoscaler")
        self.assertEqual(hpa["spec"]["scaleTargetRef"],
                         {"apiVersion": "apps/v1", "kind": "Deployment",
                          "name": cell["metadata"]["name"]})
        [metric] = hpa["spec"]["metrics"]
        self.assertEqual(metric["pods"]["metric"]["name"], "specd_router_waiting_requests")
        self.assertEqual(metric["pods"]["target"]["type"], "AverageValue")
        names = [c["name"] for c in cell["spec"]["template"]["spec"]["containers"]]
        self.assertEqual(names, ["router", "draft", "target", "target-rank-1", "target-rank-2"])
        [svc] = [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-router")]
        self.assertTrue(matches(svc["spec"]["selector"],
                                cell["spec"]["template"]["metadata"]["labels"]))
        self.assertEqual(by_kind(self.rendered["cpu-default"], "HorizontalPodAutoscaler"), [])


class ChartClusterTest(unittest.TestCase):
    """The chart's own command lines, started on loopback, then scraped by a real Prometheus."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="specd-helm-test-")
        cls.procs = {}
        cls.ports = {k: free_port() for k in (
            "router", "http", "router_metrics", "target", "target_metrics", "draft",
            "draft_metrics", "rendezvous")}
        # Binaries where the chart's binDir says they are (the image's /opt/specd/bin).
        bindir = os.path.join(cls.tmp, "bin")
        os.makedirs(bindir)
        for name, sub in (("specd-router", "services"), ("specd-target", "services"),
                          ("specd-draft", "services"), ("specd", "tools")):
            os.symlink(os.path.join(BUILD, sub, name), os.path.join(bindir, name))
        p = cls.ports
        cls.sets = [f"binDir={bindir}", f"model.dir={os.path.join(ROOT, 'models')}",
                    f"draft.draftDir={os.path.join(ROOT, 'drafts')}",
                    f"router.grpcPort={p['router']}", f"router.httpPort={p['http']}",
                    f"router.metricsPort={p['router_metrics']}",
                    f"target.grpcPort={p['target']}", f"target.metricsPort={p['target_metrics']}",
                    f"draft.grpcPort={p['draft']}", f"draft.metricsPort={p['draft_metrics']}",
                    "target.threads=1", "draft.threads=1", "drainGraceSeconds=5",
                    "router.maxQueue=64", "router.prefillTokensWhileDecoding=64",
                    "router.stepMsWhileDecoding=80",
                    # the default model's 9 heads / 3 KV heads: three rank processes
                    "target.worldSize=3", f"target.rendezvousPort={p['rendezvous']}"]
        cls.docs = helm_template(cls.sets)
        cls.fullname = "cell-specd"
        for component in ("target", "draft", "router"):
            cls.start(component)
        for component in ("target", "draft", "router"):
            if not cls.wait_healthy(component, 120):
                raise AssertionError(f"{component} never passed its probe:\n" + cls.log(component))

    @classmethod
    def tearDownClass(cls):
        for proc in cls.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def containers(cls, component, docs=None):
        for w in workloads(docs or cls.docs):
            if w["metadata"]["name"] == f"{cls.fullname}-{component}":
                return w["spec"]["template"]["spec"]["containers"]
        raise KeyError(component)

    @classmethod
    def container(cls, component, docs=None):
        return cls.containers(component, docs)[0]

    @classmethod
    def command_line(cls, component, docs=None, index=0):
        """A container's command + args, with the Services' DNS names made loopback."""
        c = cls.containers(component, docs)[index]
        argv = c["command"] + c["args"]
        return [re.sub(rf"{cls.fullname}-(router|draft|target):", "127.0.0.1:", a) for a in argv]

    @classmethod
    def start(cls, component):
        """Every container of the component's pod (the target's rank containers too)."""
        for i, c in enumerate(cls.containers(component)):
            name = component if i == 0 else c["name"]
            with open(os.path.join(cls.tmp, f"{name}.log"), "w") as log:
                cls.procs[name] = subprocess.Popen(cls.command_line(component, index=i),
                                                   stdout=log, stderr=subprocess.STDOUT)

    @classmethod
    def log(cls, component):
        with open(os.path.join(cls.tmp, f"{component}.log")) as f:
            return f.read()[-4000:]

    @classmethod
    def probe(cls, component, which="readinessProbe"):
        probe = cls.container(component)[which]
        if "tcpSocket" in probe:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", probe["tcpSocket"]["port"])) == 0
        port = probe["grpc"]["port"]
        p = run([os.path.join(BUILD, "tools", "specd"), "client", "health", "--server",
                 f"127.0.0.1:{port}", "--timeout", "2"], ok=False)
        return p.returncode == 0 and "SERVING" in p.stdout

    @classmethod
    def wait_healthy(cls, component, timeout_s):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if cls.procs[component].poll() is not None:
                return False
            if all(cls.probe(component, w) for w in ("startupProbe", "readinessProbe",
                                                     "livenessProbe")):
                return True
            time.sleep(0.5)
        return False

    def test_a_flag_the_binary_does_not_accept_fails(self):
        docs = helm_template(self.sets + ["target.extraArgs[0]=--no-such-flag=1"])
        p = run(self.command_line("target", docs), ok=False, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("unknown flag --no-such-flag", p.stderr)

    def test_answers_a_prompt_over_grpc_and_http(self):
        p = run([os.path.join(BUILD, "tools", "specd"), "client", "generate", "--server",
                 f"127.0.0.1:{self.ports['router']}", "--chat", "-p", "What is 2+2?", "-n", "12",
                 "--temp", "0"], timeout=120)
        self.assertGreater(len(p.stdout.strip()), 0, p.stderr)
        body = json.dumps({"model": "SmolLM2-135M-Instruct.Q4_1", "max_tokens": 8,
                           "messages": [{"role": "user", "content": "Say hello."}]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.ports['http']}/v1/chat/completions",
                                     data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            answer = json.load(r)
        self.assertGreater(answer["usage"]["completion_tokens"], 0)
        self.assertTrue(answer["choices"][0]["message"]["content"])

    def test_prometheus_evaluates_every_dashboard_query_and_alert_rule(self):
        prom_port = free_port()
        config = self.prometheus_config()
        prom_dir = os.path.join(self.tmp, "prometheus")
        os.makedirs(prom_dir, exist_ok=True)
        prom_log = open(os.path.join(prom_dir, "log"), "w")
        prom = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={prom_dir}/data",
             f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=prom_log,
            stderr=subprocess.STDOUT)
        # Load: drafting with a fixed k (the adaptive policy may choose k = 0 on a slow CPU,
        # which would leave the speculation panels empty), the n-gram drafter and adaptive k.
        loads = [subprocess.Popen(
            [os.path.join(BUILD, "loadtest", "specd-loadtest"), "--server",
             f"127.0.0.1:{self.ports['router']}", "--mode", "closed", "--concurrency", "2",
             "--requests", "200", "--max-new-tokens", "24", "--spec", spec, "--k", k],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for spec, k in (("draft", "3"), ("ngram", "3"), ("auto", "0"))]
        self.maxDiff = None
        try:
            api = f"http://127.0.0.1:{prom_port}/api/v1"
            queries = self.dashboard_queries() + [(f"alert {n} (signal)", s)
                                                  for n, s, _ in self.alert_rules()]
            deadline = time.time() + 90
            missing = queries
            while missing and time.time() < deadline:
                time.sleep(2)
                missing = []
                for what, q in queries:
                    try:
                        data = self.query(api, q)
                    except OSError:
                        missing.append((what, q))  # Prometheus still starting
                        continue
                    self.assertEqual(data["status"], "success", f"{what}: {q}: {data}")
                    if not data["data"]["result"]:
                        missing.append((what, q))
            self.assertEqual(missing, [], "queries without series under load")
            # Every rule, evaluated by Prometheus itself: health ok, no error.
            rules = json.load(urllib.request.urlopen(f"{api}/rules", timeout=10))
            seen = {}
            for g in rules["data"]["groups"]:
                for r in g["rules"]:
                    seen[r["name"]] = (r["health"], r.get("lastError", ""))
            self.assertEqual(sorted(seen), sorted(n for n, _, _ in self.alert_rules()))
            for name, (health, err) in seen.items():
                self.assertEqual(health, "ok", f"{name}: {err}")
            for name, _, whole in self.alert_rules():
                self.assertEqual(self.query(api, whole)["status"], "success", name)
            targets = json.load(urllib.request.urlopen(f"{api}/targets", timeout=10))
            self.assertEqual(sorted(t["labels"]["job"] for t in targets["data"]["activeTargets"]
                                    if t["health"] == "up"),
                             ["specd-draft", "specd-router", "specd-target"])
        finally:
            for load in loads:
                load.kill()
                load.wait()
            prom.terminate()
            prom.wait(timeout=30)
            prom_log.close()

    def test_zz_sigterm_drains_and_every_service_exits_zero(self):
        # Last (unittest runs tests in name order): the kubelet's stop, for every container at
        # once (rank processes end when rank 0 stops the group).
        self.assertEqual(sorted(self.procs), ["draft", "router", "target", "target-rank-1",
                                              "target-rank-2"])
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            self.assertEqual(proc.wait(timeout=60), 0, self.log(name))

    @staticmethod
    def query(api, q):
        url = f"{api}/query?" + urllib.parse.urlencode({"query": q})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            return json.load(e)  # a bad query: 400 with status "error"

    def prometheus_config(self):
        """deploy/prometheus.yml with this test's ports, a 1 s scrape and the rules file's
        absolute path."""
        with open(os.path.join(ROOT, "deploy", "prometheus.yml")) as f:
            config = yaml.safe_load(f)
        config["global"]["scrape_interval"] = "1s"
        config["global"]["evaluation_interval"] = "1s"
        config["rule_files"] = [os.path.normpath(os.path.join(ROOT, "deploy", r))
                                for r in config["rule_files"]]
        port_of = {"specd-router": self.ports["router_metrics"],
                   "specd-target": self.ports["target_metrics"],
                   "specd-draft": self.ports["draft_metrics"]}
        for job in config["scrape_configs"]:
            job["static_configs"] = [{"targets": [f"127.0.0.1:{port_of[job['job_name']]}"]}]
        path = os.path.join(self.tmp, "prometheus.yml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        return path

    @staticmethod
    def dashboard_queries():
        with open(os.path.join(CHART, "files", "grafana-dashboard.json")) as f:
            dash = json.load(f)
        out = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
        assert len(out) > 10
        return out

    @staticmethod
    def alert_rules():
        """(name, signal, whole expression): the signal is the expression before its final
        top-level comparison."""
        with open(os.path.join(CHART, "files", "alerts.yaml")) as f:
            rules = yaml.safe_load(f)
        out = []
        for g in rules["groups"]:
            for r in g["rules"]:
                expr = " ".join(r["expr"].split())
                m = re.fullmatch(r"(.*\S)\s*(<|>|<=|>=|==|!=)\s*[0-9.]+", expr)
                assert m, f"{r['alert']}: not '<signal> <op> <threshold>': {expr}"
                out.append((r["alert"], m.group(1), expr))
        return out


class PodCellClusterTest(unittest.TestCase):
    """cell.layout=pod: the cell pod's containers, command lines from the rendered chart,
    started on loopback as the pod would run them (the router dials the draft and target on
    localhost), the target on the int8 KV cache: every container passes its probes, the cell
    answers, SIGTERM ends all."""

    def test_the_pod_cell_answers_and_drains(self):
        tmp = tempfile.mkdtemp(prefix="specd-pod-cell-")
        procs = {}
        try:
            bindir = os.path.join(tmp, "bin")
            os.makedirs(bindir)
            for name, sub in (("specd-router", "services"), ("specd-target", "services"),
                              ("specd-draft", "services")):
                os.symlink(os.path.join(BUILD, sub, name), os.path.join(bindir, name))
            ports = {k: free_port() for k in ("router", "router_metrics", "target",
                                              "target_metrics", "draft", "draft_metrics")}
            docs = helm_template([
                "cell.layout=pod", f"binDir={bindir}",
                f"model.dir={os.path.join(ROOT, 'models')}",
                f"draft.draftDir={os.path.join(ROOT, 'drafts')}",
                f"router.grpcPort={ports['router']}", "router.httpPort=0",
                f"router.metricsPort={ports['router_metrics']}",
                f"target.grpcPort={ports['target']}", f"target.metricsPort={ports['target_metrics']}",
                f"draft.grpcPort={ports['draft']}", f"draft.metricsPort={ports['draft_metrics']}",
                "target.threads=1", "draft.threads=1", "drainGraceSeconds=5",
                "target.kvDtype=int8"])  # and the int8 KV cache, end to end
            [cell] = workloads(docs)
            containers = cell["spec"]["template"]["spec"]["containers"]
            self.assertEqual([c["name"] for c in containers], ["router", "draft", "target"])
            for c in containers:
                log = open(os.path.join(tmp, c["name"] + ".log"), "w")
                procs[c["name"]] = (subprocess.Popen(c["command"] + c["args"], stdout=log,
                                                     stderr=subprocess.STDOUT), log)

            def log_of(name):
                with open(os.path.join(tmp, name + ".log")) as f:
                    return f.read()[-3000:]

            def probe_ok(c, which):
                probe = c[which]
                if "tcpSocket" in probe:
                    with socket.socket() as sock:
                        return sock.connect_ex(("127.0.0.1", probe["tcpSocket"]["port"])) == 0
                p = run([os.path.join(BUILD, "tools", "specd"), "client", "health", "--server",
                         f"127.0.0.1:{probe['grpc']['port']}", "--timeout", "2"], ok=False)
                return p.returncode == 0 and "SERVING" in p.stdout

            deadline = time.time() + 120
            pending = list(containers)
            while pending and time.time() < deadline:
                for c in list(pending):
                    self.assertIsNone(procs[c["name"]][0].poll(), log_of(c["name"]))
                    if all(probe_ok(c, w) for w in ("startupProbe", "readinessProbe",
                                                    "livenessProbe")):
                        pending.remove(c)
                time.sleep(0.5)
            self.assertEqual(pending, [], "containers never passed their probes")
            p = run([os.path.join(BUILD, "tools", "specd"), "client", "generate", "--server",
                     f"127.0.0.1:{ports['router']}", "--chat", "-p", "What is 2+2?", "-n", "12",
                     "--temp", "0"], timeout=120)
            self.assertGreater(len(p.stdout.strip()), 0, p.stderr)
            for proc, _ in procs.values():
                proc.send_signal(signal.SIGTERM)
            for name, (proc, _) in procs.items():
                self.assertEqual(proc.wait(timeout=60), 0, log_of(name))
        finally:
            for proc, log in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                log.close()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    BUILD = os.path.abspath(sys.argv.pop(1))
    tools = os.environ.get("SPECD_TOOLS_BIN", "")
    HELM = os.path.join(tools, "helm")
    if not os.access(HELM, os.X_OK):
        sys.exit("helm_chart_test: SPECD_TOOLS_BIN does not hold helm "
                 "(scripts/test.sh sets it from scripts/install_deploy_tools.sh)")
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            sys.exit(f"helm_chart_test: {tool} is not on PATH (scripts/install_deps.sh installs it)")
    unittest.main(verbosity=2)
