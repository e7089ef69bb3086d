"""Checks deploy/k8s/*.yaml (or deploy/k8s-elastic's) against the daemons:
the counts and names agree (StatefulSet replicas, headless Service, pserver
list, an Indexed Job of trainers, or an elastic job's trainer Deployment
whose replicas lie within its --elastic MIN:MAX and whose MAX the pservers
take as their trainer count), every
environment variable a container gets is one its daemon reads, and each
pod's container, with the environment Kubernetes would give it (downward API
values filled in, the Secret and volumes mapped to temporary folders, the
pod's host name set in a UTS namespace), passes the daemon's own
--check-config with the id and counts intended.

  k8s_manifests.py BIN_DIR MANIFEST_DIR SCRATCH
"""
import os
import re
import subprocess
import sys

import yaml

BIN, MANIFESTS, SCRATCH = sys.argv[1:4]
failures = []


def fail(msg):
    failures.append(msg)
    print(f"FAIL: {msg}", file=sys.stderr)


docs = []
for name in sorted(os.listdir(MANIFESTS)):
    if name.endswith((".yaml", ".yml")):
        with open(os.path.join(MANIFESTS, name)) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
by_kind = {}
for d in docs:
    by_kind.setdefault(d["kind"], []).append(d)
sts = by_kind["StatefulSet"][0]
svc = next(s for s in by_kind["Service"] if s["metadata"]["name"] == sts["spec"]["serviceName"])
job = (by_kind.get("Job") or [None])[0]
deployment = next((d for d in by_kind.get("Deployment", [])
                   if d["metadata"].get("labels", {}).get("role") == "trainer"), None)
trainer_obj = job or deployment


def container(obj):
    return obj["spec"]["template"]["spec"]["containers"][0]


def env_value(entry, pod):
    if "value" in entry:
        return str(entry["value"])
    path = entry["valueFrom"]["fieldRef"]["fieldPath"]
    known = {"metadata.name": pod["name"], "status.podIP": pod["ip"],
             "metadata.annotations['batch.kubernetes.io/job-completion-index']": pod.get("index")}
    if known.get(path) is None:
        fail(f"{pod['name']}: env {entry['name']} comes from {path}, which this check does not know")
        return ""
    return str(known[path])


def help_vars(binary):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, check=True).stdout
    # Read with getenv besides the option table: the role, and the pod's address.
    return set(re.findall(r"\b(PADDLE_[A-Z_]+|PSTRAIN_[A-Z_]+)\b", out)) | {"TRAINING_ROLE", "POD_IP"}


# Names and counts agree.
if svc["spec"].get("clusterIP") != "None":
    fail(f"Service {svc['metadata']['name']} is not headless (clusterIP: None)")
labels = sts["spec"]["template"]["metadata"]["labels"]
if any(labels.get(k) != v for k, v in svc["spec"]["selector"].items()):
    fail("the Service's selector does not select the pserver pods")
port = svc["spec"]["ports"][0]["port"]
replicas = sts["spec"]["replicas"]
want_list = ",".join(f"{sts['metadata']['name']}-{i}.{svc['metadata']['name']}:{port}"
                     for i in range(replicas))
elastic = None
if job is not None:
    trainers = pods = job["spec"]["completions"]
    if job["spec"].get("completionMode") != "Indexed" or job["spec"].get("parallelism") != trainers:
        fail("the trainer Job must be Indexed with parallelism = completions")
else:
    # Elastic: kubectl scale changes the replicas between MIN and MAX.
    args = container(deployment).get("args", [])
    elastic = args[args.index("--elastic") + 1] if "--elastic" in args else "?:?"
    lo, hi = (int(x) if x.isdigit() else 0 for x in elastic.split(":"))
    trainers, pods = hi, deployment["spec"]["replicas"]
    if not 1 <= lo <= pods <= hi:
        fail(f"the trainer Deployment's {pods} replicas are not within --elastic {elastic}")
    if any(e["name"] == "PADDLE_TRAINER_ID" for e in container(deployment).get("env", [])):
        fail("elastic trainers take their ids from pserver 0: no PADDLE_TRAINER_ID")
for obj in (sts, trainer_obj):
    env = {e["name"]: e.get("value") for e in container(obj).get("env", [])}
    if env.get("PADDLE_PSERVERS_IP_PORT_LIST") != want_list:
        fail(f"{obj['kind']}: PADDLE_PSERVERS_IP_PORT_LIST is {env.get('PADDLE_PSERVERS_IP_PORT_LIST')},"
             f" the StatefulSet's pods are {want_list}")
    if env.get("PADDLE_TRAINERS_NUM", str(trainers) if obj is deployment else None) != str(trainers):
        fail(f"{obj['kind']}: PADDLE_TRAINERS_NUM {env.get('PADDLE_TRAINERS_NUM')}, the job has {trainers}")

# Volumes: the Secret holds the token; the pserver's checkpoint folder is a claim.
token = os.path.join(SCRATCH, "token")
with open(token, "w") as f:
    f.write("k8s-check-token-0123456789abcdef\n")
os.chmod(token, 0o600)


def mounts(obj):
    spec = obj["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    claims = {c["metadata"]["name"] for c in obj["spec"].get("volumeClaimTemplates", [])}
    result = {}
    for m in container(obj).get("volumeMounts", []):
        kind = "secret" if "secret" in vols.get(m["name"], {}) else (
            "claim" if m["name"] in claims else "other")
        folder = os.path.join(SCRATCH, obj["metadata"]["name"] + "-" + m["name"])
        os.makedirs(folder, exist_ok=True)
        if kind == "secret":
            os.link(token, os.path.join(folder, "token")) if not os.path.exists(
                os.path.join(folder, "token")) else None
        result[m["mountPath"]] = (kind, folder)
    return result


def run_pod(obj, binary, pod, expect):
    c = container(obj)
    maps = mounts(obj)
    env = {"PATH": "/usr/bin:/bin"}
    readable = help_vars(binary)
    for e in c.get("env", []):
        if e["name"] not in readable:
            fail(f"{pod['name']}: env {e['name']} is read by no daemon ({os.path.basename(binary)} --help)")
        value = env_value(e, pod)
        for path, (kind, folder) in maps.items():
            if value.startswith(path + "/") or value == path:
                value = folder + value[len(path):]
        env[e["name"]] = value
    for name in ("PSTRAIN_TOKEN_FILE",):
        if name in env and not any(env[name].startswith(f) for k, f in maps.values() if k == "secret"):
            fail(f"{pod['name']}: {name} is not on the Secret's volume")
    if "PSTRAIN_CHECKPOINT_DIR" in env and not any(
            env["PSTRAIN_CHECKPOINT_DIR"] == f for k, f in maps.values() if k == "claim"):
        fail(f"{pod['name']}: PSTRAIN_CHECKPOINT_DIR is not a volume claim's mount")
    if c["command"][0] != os.path.basename(binary):
        fail(f"{pod['name']}: runs {c['command'][0]}, expected {os.path.basename(binary)}")
    argv = [binary] + c["command"][1:] + c.get("args", []) + ["--check-config"]
    proc = subprocess.run(["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', pod["name"]]
                          + argv, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or expect not in proc.stdout:
        fail(f"{pod['name']}: --check-config exited {proc.returncode}, wanted '{expect}' in: "
             f"{proc.stdout.strip()} {proc.stderr.strip()[-400:]}")


for i in range(replicas):
    name = f"{sts['metadata']['name']}-{i}"
    run_pod(sts, os.path.join(BIN, "pserver"), {"name": name, "ip": f"10.244.0.{10 + i}"},
            f"pserver {i} of {replicas} (id from this host's name) listen=0.0.0.0:{port} "
            f"pservers={want_list} trainers={trainers} token=yes")
for i in range(pods):
    name = f"{trainer_obj['metadata']['name']}-{i}-x7k2p"
    who = f"trainer {i} of {trainers}" if elastic is None else \
        f"trainer (id from pserver 0) of {trainers} elastic={elastic}"
    run_pod(trainer_obj, os.path.join(BIN, "trainer"),
            {"name": name, "ip": f"10.244.1.{10 + i}", "index": i if job is not None else None},
            f"{who} mode=pserver pservers={want_list} token=yes")

print(f"k8s_manifests: {len(docs)} objects, {replicas} pserver pod(s), {pods} trainer pod(s) "
      f"checked; {len(failures)} failure(s)", file=sys.stderr)
sys.exit(1 if failures else 0)
