"""A stand-in for `gcloud compute tpus ...`, run as the `gcloud` executable in tests.

It appends its argv to $FAKE_GCLOUD/calls.jsonl and plays a queued resource: it exists from
`create` to `delete`; each `describe` pops the next state of the current incarnation from
$FAKE_GCLOUD/script.json (a list per create; the last state sticks). Each node has
$FAKE_WORKERS workers, each a $HOME under $FAKE_GCLOUD/vms/NODE/wK, emptied when the node is
created (a new VM). `tpu-vm scp` copies into those homes; `tpu-vm ssh --command` runs the
command there with bash for real, with a `python3` whose `-m pip install` does nothing.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(os.environ["FAKE_GCLOUD"])
WORKERS = int(os.environ.get("FAKE_WORKERS", "1"))
PYTHON3 = f"""#!/bin/sh
if [ "$1 $2 $3" = "-m pip install" ]; then echo "pip install (skipped by the fake)"; exit 0; fi
exec {sys.executable} "$@"
"""


def flag(argv, name):
    for arg in argv:
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None


def load():
    path = ROOT / "state.json"
    return json.loads(path.read_text()) if path.exists() else {"exists": False, "created": 0}


def save(state):
    (ROOT / "state.json").write_text(json.dumps(state))


def homes(node, worker):
    base = ROOT / "vms" / node
    workers = range(WORKERS) if worker == "all" else [int(worker)]
    return [base / f"w{k}" for k in workers]


def nodes_of(argv):
    if flag(argv, "node-id"):
        return [flag(argv, "node-id")]
    return [f"{flag(argv, 'node-prefix')}-{i}" for i in range(int(flag(argv, "node-count")))]


def queued_resources(verb, argv):
    state = load()
    if verb == "create":
        if state["exists"]:
            sys.exit("ERROR: (gcloud) ALREADY_EXISTS")
        script = json.loads((ROOT / "script.json").read_text())
        state.update(exists=True, states=list(script[state["created"]]),
                     created=state["created"] + 1, nodes=nodes_of(argv))
        for node in state["nodes"]:
            shutil.rmtree(ROOT / "vms" / node, ignore_errors=True)
            for home in homes(node, "all"):
                home.mkdir(parents=True)
        save(state)
        return
    if not state["exists"]:
        sys.exit(f"ERROR: (gcloud) NOT_FOUND: {argv[5]}")
    if verb == "delete":
        state["exists"] = False
        save(state)
        return
    current = state["states"][0] if len(state["states"]) == 1 else state["states"].pop(0)
    save(state)
    if flag(argv, "format") == "value(state.state)":
        print(current)
    else:
        print(f"name: {argv[5]}\nstate:\n  state: {current}")


def tpu_vm(verb, argv):
    if verb == "describe":
        node = argv[5]
        print(f"10.0.0.{node.rsplit('-', 1)[-1] if node[-1].isdigit() else 0}")
        return
    if verb == "scp":
        local, target = argv[5], argv[6]
        node, remote = target.split(":", 1)
        for home in homes(node, flag(argv, "worker")):
            shutil.copy(local, home / remote)
        return
    node, command = argv[5], flag(argv, "command")
    fakebin = ROOT / "fakebin"
    if not (fakebin / "python3").exists():          # slices' ssh calls run concurrently
        fakebin.mkdir(exist_ok=True)
        tmp = fakebin / f"python3.{os.getpid()}"
        tmp.write_text(PYTHON3)
        tmp.chmod(0o755)
        os.replace(tmp, fakebin / "python3")
    code = 0
    for home in homes(node, flag(argv, "worker")):
        env = {"HOME": str(home), "PATH": f"{fakebin}:{os.environ['PATH']}"}
        code = max(code, subprocess.run(["bash", "-c", command], cwd=home, env=env).returncode)
    sys.exit(code)


def main(argv):
    with open(ROOT / "calls.jsonl", "a") as f:
        f.write(json.dumps(argv) + "\n")
    assert argv[:2] == ["compute", "tpus"], argv
    group, verb = argv[2], argv[3]
    full = ["gcloud"] + argv
    (queued_resources if group == "queued-resources" else tpu_vm)(verb, full)


if __name__ == "__main__":
    main(sys.argv[1:])
