#!/usr/bin/env python3
"""Runs a rendered Helm chart's manifests as a Kubernetes node would, here.

No Kubernetes runs on this machine (and `podman run` fails on it), so this
harness plays the kubelet for the manifests `helm template` renders: every
pod of the StatefulSets, DaemonSets and Pods gets a network-namespace host
(or its node's, with hostNetwork) on one bridge, and every container of it
runs from the image's root file system under `runc`, with the manifest's
command and arguments, environment (downward API included), volumes
(ConfigMaps, Secrets, emptyDirs, hostPaths, claims from
volumeClaimTemplates), user and groups, read-only root, capabilities and
memory limit (a real cgroup limit). Init containers run in order to
completion; readiness probes (httpGet) are polled before the next pods
start. Services become names in every pod's /etc/hosts: a headless
Service's pods by `<pod>.<service>.<namespace>.svc.<domain>`, a Service by
its name (its first pod: there is no kube-proxy). `helm.sh/hook: test` pods
run last, as `helm test` runs them, and must succeed.

What it does not do (docs/deployment.md says so too): scheduling beyond
"DaemonSet pods on every node, others round-robin", liveness probes,
restarts, resource requests, NetworkPolicies, RBAC, ServiceMonitors.

Usage (root):
  chart_harness.py --manifests RENDERED.yaml --image-bundle BUNDLE \
      [--nodes 2] [--extra SECRETS.yaml] [--expect-stores N] [--json-out F]

BUNDLE is an OCI bundle of the image (`umoci unpack`): its rootfs/ is the
containers' root, its config.json gives the entry point, environment, user
and working directory.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

BRIDGE = "nkchart0"
SUBNET = "10.213.0"
RUNC_ROOT = "/run/nk-chart-harness"


def log(msg: str) -> None:
    print(f"[chart {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sh(*cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, text=True, capture_output=True, **kw)


def quantity(q) -> int:
    """Bytes of a Kubernetes quantity (512Mi, 1G, 1073741824)."""
    s = str(q)
    units = {
        "Ki": 1 << 10,
        "Mi": 1 << 20,
        "Gi": 1 << 30,
        "Ti": 1 << 40,
        "k": 10**3,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
    }
    for u, f in units.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * f)
    return int(float(s))


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names expand, $$ escapes."""

    def one(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, text)


class Pod:
    def __init__(self, name, spec, labels, node, owner, namespace, claims=()):
        self.name = name
        self.spec = spec
        self.labels = labels
        self.node = node
        self.owner = owner
        self.namespace = namespace
        self.claims = claims  # volumeClaimTemplates of a StatefulSet
        self.ip = ""
        self.netns = ""
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []
        self.hook_test = False


class Harness:
    def __init__(self, args):
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="nk-chart-"))
        os.chmod(self.work, 0o755)
        self.bundle = Path(args.image_bundle)
        image = json.loads((self.bundle / "config.json").read_text())
        self.image_args = image["process"]["args"]
        self.image_env = image["process"].get("env", [])
        self.image_cwd = image["process"].get("cwd", "/")
        self.image_user = image["process"].get("user", {})
        self.template = image
        self.rootfs = (self.bundle / "rootfs").resolve()
        self.docs = []
        for path in [args.manifests, *args.extra]:
            self.docs += [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
        self.namespace = args.namespace
        self.nodes = [f"node-{chr(ord('a') + i)}" for i in range(args.nodes)]
        self.node_ip = {}
        self.pods: list[Pod] = []
        self.hosts: dict[str, str] = {}
        self.next_ip = 10
        self.netns: list[str] = []

    # -- objects -------------------------------------------------------
    def kind(self, kind):
        return [d for d in self.docs if d.get("kind") == kind]

    def find(self, kind, name):
        for d in self.kind(kind):
            if d["metadata"]["name"] == name:
                return d
        raise SystemExit(f"the manifests have no {kind} {name}")

    def plan(self):
        ns = self.namespace
        i = 0
        for sts in self.kind("StatefulSet"):
            spec = sts["spec"]
            for n in range(int(spec.get("replicas", 1))):
                name = f"{sts['metadata']['name']}-{n}"
                labels = dict(spec["template"]["metadata"].get("labels", {}))
                labels["apps.kubernetes.io/pod-index"] = str(n)
                labels["statefulset.kubernetes.io/pod-name"] = name
                pod = Pod(
                    name,
                    spec["template"]["spec"],
                    labels,
                    self.nodes[i % len(self.nodes)],
                    sts,
                    ns,
                    spec.get("volumeClaimTemplates", []),
                )
                pod.subdomain = spec.get("serviceName")
                i += 1
                self.pods.append(pod)
        for ds in self.kind("DaemonSet"):
            for node in self.nodes:
                spec = ds["spec"]["template"]
                pod = Pod(
                    f"{ds['metadata']['name']}-{node}",
                    spec["spec"],
                    dict(spec["metadata"].get("labels", {})),
                    node,
                    ds,
                    ns,
                )
                pod.subdomain = None
                self.pods.append(pod)
        for p in self.kind("Pod"):
            hook = p["metadata"].get("annotations", {}).get("helm.sh/hook", "")
            pod = Pod(
                p["metadata"]["name"],
                p["spec"],
                p["metadata"].get("labels", {}),
                self.nodes[0],
                p,
                ns,
            )
            pod.subdomain = None
            pod.hook_test = "test" in hook.split(",")
            self.pods.append(pod)
        for kind in ("Deployment", "Job", "ReplicaSet", "CronJob"):
            if self.kind(kind):
                raise SystemExit(f"the harness does not run {kind}s")

    # -- network -------------------------------------------------------
    def ip(self) -> str:
        self.next_ip += 1
        return f"{SUBNET}.{self.next_ip}"

    def add_host(self, name: str) -> tuple[str, str]:
        netns = f"nkchart-{len(self.netns)}"
        ip = self.ip()
        veth = f"nkc{len(self.netns)}"
        sh("ip", "netns", "add", netns)
        self.netns.append(netns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        sh("ip", "link", "set", veth, "master", BRIDGE, "up")
        sh("ip", "-n", netns, "addr", "add", f"{ip}/24", "dev", "eth0")
        sh("ip", "-n", netns, "link", "set", "eth0", "up")
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        sh("ip", "-n", netns, "route", "add", "default", "via", f"{SUBNET}.1")
        log(f"{name}: network namespace {netns}, {ip}")
        return netns, ip

    def network(self):
        sh("ip", "link", "del", BRIDGE, check=False)
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        self.node_ns = {}
        for node in self.nodes:
            self.node_ns[node], self.node_ip[node] = self.add_host(node)
        for pod in self.pods:
            if pod.spec.get("hostNetwork"):
                pod.netns, pod.ip = self.node_ns[pod.node], self.node_ip[pod.node]
            else:
                pod.netns, pod.ip = self.add_host(pod.name)
        domain = self.args.cluster_domain
        ns = self.namespace
        for pod in self.pods:
            if pod.subdomain:
                self.hosts[f"{pod.name}.{pod.subdomain}.{ns}.svc.{domain}"] = pod.ip
        for svc in self.kind("Service"):
            name = svc["metadata"]["name"]
            sel = svc["spec"].get("selector", {})
            match = [p for p in self.pods if all(p.labels.get(k) == v for k, v in sel.items())]
            if match:
                for alias in (f"{name}.{ns}.svc.{domain}", f"{name}.{ns}", name):
                    self.hosts[alias] = match[0].ip

    # -- volumes -------------------------------------------------------
    def volume_dir(self, pod: Pod, vol: dict) -> tuple[Path, bool]:
        """A host directory holding the volume's files; True if the
        volume is read-only by nature (ConfigMaps and Secrets)."""
        base = self.work / "pods" / pod.name / "volumes" / vol["name"]
        fs_group = pod.spec.get("securityContext", {}).get("fsGroup")
        if "configMap" in vol or "secret" in vol:
            src = vol.get("configMap") or vol.get("secret")
            obj = (
                self.find("ConfigMap", src["name"])
                if "configMap" in vol
                else self.find("Secret", src["secretName"])
            )
            data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
            if "secret" in vol:
                data = {k: base64.b64decode(v) for k, v in data.items()}
                data.update({k: v.encode() for k, v in (obj.get("stringData") or {}).items()})
            mode = src.get("defaultMode", 0o644)
            items = src.get("items") or [{"key": k, "path": k} for k in data]
            base.mkdir(parents=True)
            for it in items:
                f = base / it["path"]
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_bytes(data[it["key"]])
                os.chmod(f, it.get("mode", mode))
                if fs_group is not None:
                    os.chown(f, 0, fs_group)
            os.chmod(base, 0o755)
            return base, True
        if "emptyDir" in vol:
            base.mkdir(parents=True)
            os.chmod(base, 0o777)
            if fs_group is not None:
                os.chown(base, 0, fs_group)
                os.chmod(base, 0o2777)
            return base, False
        if "hostPath" in vol:
            hp = vol["hostPath"]
            d = self.work / "nodes" / pod.node / hp["path"].lstrip("/")
            if hp.get("type") == "Directory" and not d.is_dir():
                # The node's administrator makes it, owned by the pods'
                # user, as the chart's README asks.
                d.mkdir(parents=True)
                user = pod.spec.get("securityContext", {}).get("runAsUser", 0)
                os.chown(d, user, fs_group or 0)
                os.chmod(d, 0o700)
            d.mkdir(parents=True, exist_ok=True)
            return d, False
        if "persistentVolumeClaim" in vol:
            raise SystemExit(f"{pod.name}: standalone claims are not supported")
        raise SystemExit(f"{pod.name}: volume {vol['name']} of an unknown kind")

    def claim_dir(self, pod: Pod, claim: dict) -> Path:
        # A provisioner's new volume, kept across the pod's restarts
        # (by claim name, as a StatefulSet's claims are).
        d = self.work / "claims" / f"{claim['metadata']['name']}-{pod.name}"
        d.mkdir(parents=True, exist_ok=True)
        fs_group = pod.spec.get("securityContext", {}).get("fsGroup")
        if fs_group is not None:
            os.chown(d, 0, fs_group)
            os.chmod(d, 0o2775)
        return d

    # -- containers ----------------------------------------------------
    def env_of(self, pod: Pod, c: dict) -> dict[str, str]:
        env: dict[str, str] = {}
        for e in self.image_env:
            k, _, v = e.partition("=")
            env[k] = v
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(str(e["value"]), env)
                continue
            src = e["valueFrom"]
            if "fieldRef" in src:
                path = src["fieldRef"]["fieldPath"]
                m = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
                value = {
                    "metadata.name": pod.name,
                    "metadata.namespace": pod.namespace,
                    "status.podIP": pod.ip,
                    "spec.nodeName": pod.node,
                    "status.hostIP": self.node_ip[pod.node],
                }.get(path)
                if m:
                    value = pod.labels.get(m.group(1))
                if value is None:
                    raise SystemExit(f"{pod.name}: fieldRef {path} is not known here")
                env[e["name"]] = value
            elif "resourceFieldRef" in src:
                r = src["resourceFieldRef"]
                kind, what = r["resource"].split(".")
                q = c.get("resources", {}).get(kind, {}).get(what)
                div = quantity(r.get("divisor", 1))
                env[e["name"]] = str(-(-quantity(q) // div)) if q else "0"
            elif "secretKeyRef" in src:
                r = src["secretKeyRef"]
                env[e["name"]] = base64.b64decode(
                    self.find("Secret", r["name"])["data"][r["key"]]
                ).decode()
            elif "configMapKeyRef" in src:
                r = src["configMapKeyRef"]
                env[e["name"]] = self.find("ConfigMap", r["name"])["data"][r["key"]]
            else:
                raise SystemExit(f"{pod.name}: env {e['name']} of an unknown source")
        return env

    def container_config(self, pod: Pod, c: dict, vols: dict, hosts: Path) -> dict:
        env = self.env_of(pod, c)
        entry = self.image_args
        if c.get("command"):
            argv = list(c["command"]) + list(c.get("args", []))
        elif "args" in c:
            argv = [entry[0], *c["args"]]
        else:
            argv = entry
        argv = [expand(str(a), env) for a in argv]
        psc = pod.spec.get("securityContext", {})
        csc = {**psc, **c.get("securityContext", {})}
        uid = csc.get("runAsUser", self.image_user.get("uid", 0))
        gid = csc.get("runAsGroup", self.image_user.get("gid", 0))
        if csc.get("runAsNonRoot") and uid == 0:
            raise SystemExit(f"{pod.name}/{c['name']}: runAsNonRoot with user 0")
        groups = [psc["fsGroup"]] if "fsGroup" in psc else []
        groups += psc.get("supplementalGroups", [])
        caps = csc.get("capabilities", {})
        keep = (
            []
            if "ALL" in caps.get("drop", [])
            else list(self.template["process"].get("capabilities", {}).get("bounding", []))
        )
        keep += [f"CAP_{x}" for x in caps.get("add", [])]
        mounts = [m for m in self.template["mounts"] if m["destination"] != "/etc/hosts"]
        mounts.append(
            {
                "destination": "/etc/hosts",
                "type": "bind",
                "source": str(hosts),
                "options": ["bind", "ro"],
            }
        )
        for m in c.get("volumeMounts", []):
            src, ro_kind = vols[m["name"]]
            if m.get("subPath"):
                src = src / m["subPath"]
            opts = ["rbind"]
            if m.get("readOnly") or ro_kind:
                opts.append("ro")
            mounts.append(
                {"destination": m["mountPath"], "type": "bind", "source": str(src), "options": opts}
            )
        cfg = json.loads(json.dumps(self.template))
        cfg["root"] = {
            "path": str(self.rootfs),
            "readonly": bool(csc.get("readOnlyRootFilesystem")),
        }
        cfg["hostname"] = pod.name if not pod.spec.get("hostNetwork") else pod.node
        proc = cfg["process"]
        proc.update(
            {
                "terminal": False,
                "args": argv,
                "env": [f"{k}={v}" for k, v in env.items()],
                "cwd": c.get("workingDir", self.image_cwd),
                "user": {"uid": uid, "gid": gid, "additionalGids": groups},
                "noNewPrivileges": csc.get("allowPrivilegeEscalation") is False,
                "capabilities": {k: keep for k in ("bounding", "effective", "permitted")},
            }
        )
        proc.pop("rlimits", None)
        cfg["mounts"] = mounts
        linux = cfg.setdefault("linux", {})
        # The pod's network namespace (joined by path: `ip netns exec`
        # would hide the cgroup mounts runc needs).
        linux["namespaces"] = [n for n in linux.get("namespaces", []) if n["type"] != "network"]
        linux["namespaces"].append({"type": "network", "path": f"/var/run/netns/{pod.netns}"})
        limit = c.get("resources", {}).get("limits", {}).get("memory")
        linux["resources"] = {"memory": {"limit": quantity(limit)}} if limit else {}
        linux["cgroupsPath"] = f"/nk-chart/{pod.name}-{c['name']}"
        return cfg

    def run_container(self, pod: Pod, c: dict, vols, hosts, wait: bool):
        cid = f"nkchart-{pod.name}-{c['name']}"
        b = self.work / "bundles" / cid
        b.mkdir(parents=True)
        (b / "config.json").write_text(
            json.dumps(self.container_config(pod, c, vols, hosts), indent=1)
        )
        out = self.work / "logs" / f"{pod.name}.{c['name']}.log"
        out.parent.mkdir(exist_ok=True)
        cmd = ["runc", "--root", RUNC_ROOT, "run", "--bundle", str(b), cid]
        with open(out, "wb") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        pod.procs.append((cid, p, out))
        if wait:
            rc = p.wait()
            if rc != 0:
                raise SystemExit(
                    f"{pod.name}: container {c['name']} exited {rc}:\n{out.read_text()}"
                )
            log(f"{pod.name}: {c['name']} done")
        return p, out

    def start(self, pod: Pod):
        vols = {}
        for v in pod.spec.get("volumes", []):
            vols[v["name"]] = self.volume_dir(pod, v)
        for claim in pod.claims:
            vols[claim["metadata"]["name"]] = (self.claim_dir(pod, claim), False)
        hosts = self.work / "pods" / pod.name / "hosts"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost", f"{pod.ip} {pod.name}"]
        lines += [f"{ip} {name}" for name, ip in sorted(self.hosts.items())]
        hosts.write_text("\n".join(lines) + "\n")
        for c in pod.spec.get("initContainers", []):
            self.run_container(pod, c, vols, hosts, wait=True)
        for c in pod.spec["containers"]:
            self.run_container(pod, c, vols, hosts, wait=pod.hook_test)
        log(f"{pod.name}: started on {pod.node} at {pod.ip}")

    def ready(self, pod: Pod, deadline: float):
        probes = []
        for c in pod.spec["containers"]:
            p = c.get("readinessProbe", {}).get("httpGet")
            if not p:
                continue
            port = p["port"]
            if isinstance(port, str):
                port = next(x["containerPort"] for x in c["ports"] if x.get("name") == port)
            probes.append((c["name"], f"http://{pod.ip}:{port}{p.get('path', '/')}"))
        for name, url in probes:
            while True:
                for cid, proc, out in pod.procs:
                    if proc.poll() is not None:
                        raise SystemExit(f"{cid} exited {proc.returncode}:\n{out.read_text()}")
                try:
                    with urllib.request.urlopen(url, timeout=2) as r:
                        if r.status == 200:
                            break
                except Exception:
                    pass
                if time.time() > deadline:
                    raise SystemExit(f"{pod.name}/{name}: not ready at {url} after the wait")
                time.sleep(0.5)
            log(f"{pod.name}/{name}: ready ({url})")

    def exec(self, pod: Pod, container: str, *argv: str) -> str:
        cid = f"nkchart-{pod.name}-{container}"
        r = sh("runc", "--root", RUNC_ROOT, "exec", cid, *argv, check=False)
        if r.returncode != 0:
            raise SystemExit(f"exec {argv} in {cid}: {r.returncode}\n{r.stdout}{r.stderr}")
        return r.stdout

    # -- the run -------------------------------------------------------
    def run(self) -> dict:
        self.plan()
        self.network()
        deadline = time.time() + self.args.wait
        servers = [p for p in self.pods if not p.hook_test]
        # Every server pod at once (the StatefulSet is Parallel; a
        # DaemonSet's pods start on their nodes at once), then readiness.
        for pod in servers:
            self.start(pod)
        for pod in servers:
            self.ready(pod, deadline)
        tests = [p for p in self.pods if p.hook_test]
        result = {"pods": [p.name for p in self.pods], "tests": {}}
        for pod in tests:
            self.start(pod)
            logs = {
                c["name"]: (self.work / "logs" / f"{pod.name}.{c['name']}.log").read_text()
                for c in pod.spec["containers"]
            }
            result["tests"][pod.name] = logs
            log(f"{pod.name}: succeeded")
        meta = next(p for p in servers if p.owner["kind"] == "StatefulSet")
        while True:
            # `kubectl exec` into the first metadata pod.
            status = json.loads(
                self.exec(
                    meta,
                    meta.spec["containers"][0]["name"],
                    "/usr/local/bin/nk",
                    "status",
                    "--json",
                )
            )
            if not self.args.until or eval(self.args.until, {}, {"s": status}):
                break
            if time.time() > deadline:
                raise SystemExit(f"nk status never met {self.args.until}: {json.dumps(status)}")
            time.sleep(0.5)
        result["status"] = status
        result["node_ips"] = [self.node_ip[n] + ":" for n in self.nodes]
        return result

    def teardown(self):
        for pod in self.pods:
            for cid, proc, _ in pod.procs:
                if proc.poll() is None:
                    sh("runc", "--root", RUNC_ROOT, "kill", cid, "TERM", check=False)
        end = time.time() + 30
        for pod in self.pods:
            for cid, proc, _ in pod.procs:
                try:
                    proc.wait(timeout=max(0.1, end - time.time()))
                except subprocess.TimeoutExpired:
                    sh("runc", "--root", RUNC_ROOT, "kill", cid, "KILL", check=False)
                    proc.wait()
                sh("runc", "--root", RUNC_ROOT, "delete", "-f", cid, check=False)
        for ns in self.netns:
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", BRIDGE, check=False)
        if self.args.keep:
            log(f"kept {self.work}")
        else:
            shutil.rmtree(self.work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifests", required=True)
    ap.add_argument("--image-bundle", required=True)
    ap.add_argument(
        "--extra",
        action="append",
        default=[],
        help="more manifests applied first (Secrets a user makes)",
    )
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--cluster-domain", default="cluster.local")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--wait", type=float, default=300, help="seconds to wait for readiness")
    ap.add_argument("--json-out")
    ap.add_argument(
        "--until",
        help="a Python expression on `s`, the metadata pod's "
        "`nk status --json`, polled after the tests until it holds",
    )
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("chart_harness: needs root (network namespaces, runc)", file=sys.stderr)
        return 2
    h = Harness(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        result = h.run()
    except SystemExit as e:
        if isinstance(e.code, str):
            print(f"chart_harness: {e.code}", file=sys.stderr)
            for f in sorted((h.work / "logs").glob("*.log")) if (h.work / "logs").exists() else []:
                print(f"--- {f.name}\n{f.read_text()[-3000:]}", file=sys.stderr)
            return 1
        raise
    finally:
        h.teardown()
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"pods": result["pods"], "tests": list(result["tests"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
