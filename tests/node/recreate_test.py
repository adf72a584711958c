"""Same-name re-creation after an eviction, on a real node (label `node;slow`; issue #27 §2).

A Chief + Worker job under `restartScope: Group`; the worker, then the chief, then the worker
again are evicted through the Eviction API (EVICTIONS); each time the operator deletes the group
and re-creates both pods under the same names (new UIDs). Sampled every ~0.2 s over each
recovery and SETTLE_SECONDS past it:

- no pod of a new UID ever shows a container state (state or lastState) that started before the
  pod itself was created, and none shows a non-zero terminated state (the old pods' 138/143
  once landed on the new pods, and the kubelet's every status update was then refused);
- the job's phase is not `Restarting` once every pod of the job is a new one whose container
  runs (allowing SETTLE_SECONDS for the operator to observe it: the defect held it for ~48 s).

The job's max_steps is far beyond what the test trains: on a fast machine a 1000-step job ended
before its last eviction. After the last recovery the test waits for training to go on past
the last eviction's step, then deletes the job (that a job trains to Succeeded through faults is
user_path_test's).

Shares the node, the chart install and the images with user_path_test.py (its fixtures).
Run: tests/node/run_node_test.sh recreate_test.py  (as root; ctest: node_recreate_test).
"""

from __future__ import annotations

import datetime
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import node_harness as nh  # noqa: E402
import user_path_test as up  # noqa: E402
from user_path_test import node, operator  # noqa: E402,F401  (fixtures)

up.WORKDIR = up.BINARY_DIR / "node_recreate_test"
NS, JOB = "ml-recreate", "regroup"
STEPS = 1_000_000  # never reached: the test deletes the job
SETTLE_SECONDS = 10.0
# (step, pod): each evicted through the Eviction API once the job trains past the step.
EVICTIONS = [(150, "worker-0"), (450, "chief-0"), (750, "worker-0")]
# After the last recovery, training must go on to this step (past a checkpoint after the last
# eviction: the group resumed from one at most 50 steps back).
FINAL_STEP = EVICTIONS[-1][0] + 150


def group_job() -> dict:
    job = up.fault_job(JOB)
    job["metadata"]["namespace"] = NS
    spec = job["spec"]
    spec["runPolicy"]["restartScope"] = "Group"
    spec["replicaSpecs"]["Worker"]["replicas"] = 1
    for r in spec["replicaSpecs"].values():
        args = r["template"]["spec"]["containers"][0]["args"]
        r["template"]["spec"]["containers"][0]["args"] = [
            f"--set=training.max_steps={STEPS}" if a.startswith("--set=training.max_steps=")
            # a multiple of batch_size * seq_len * world_size (4 * 64 * 2)
            else "--set=training.total_batch_tokens=1024"
            if a.startswith("--set=training.total_batch_tokens=") else a
            for a in args]
    return job


def when(t: str | None) -> datetime.datetime | None:
    return datetime.datetime.fromisoformat(t.replace("Z", "+00:00")) if t else None


def stale_states(pod: dict) -> list[str]:
    """What in a pod's container statuses cannot belong to this pod (by its UID)."""
    created = when(pod["metadata"]["creationTimestamp"])
    bad = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        for which in ("state", "lastState"):
            for kind, s in (cs.get(which) or {}).items():
                started = when((s or {}).get("startedAt"))
                if started is not None and started < created:
                    bad.append(f"{cs['name']}.{which}.{kind} started {s['startedAt']} before the "
                               f"pod was created {pod['metadata']['creationTimestamp']}")
                if kind == "terminated" and (s or {}).get("exitCode", 0) != 0:
                    bad.append(f"{cs['name']}.{which}.terminated exit {s.get('exitCode')}")
    return bad


def running(pod: dict) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all("running" in (cs.get("state") or {}) for cs in statuses)


def test_evicted_pods_group_recreation_shows_no_old_state_and_no_restarting_while_training(
        node, operator):
    up.ensure_job_namespace(node, NS)
    node.add_volume()
    up.kubectl(node, "apply", "-f", "-", input=json.dumps(group_job()))

    def job() -> dict:
        return node.api.get(f"/apis/longhaul.dev/v1alpha1/namespaces/{NS}/trainingjobs/{JOB}") or {}

    def pods() -> list[dict]:
        return node.api.get(f"/api/v1/namespaces/{NS}/pods?labelSelector=longhaul.dev/job-name%3D{JOB}")["items"]

    violations: list[str] = []
    seen_uids: set[str] = set()  # pods that existed before the current eviction
    recoveries: list[float] = []

    def sample(evicted_at: float, state: dict) -> dict:
        """One look at the pods and the job; records what breaks the promises."""
        now = time.monotonic()
        current, status = pods(), job().get("status") or {}
        new = [p for p in current if p["metadata"]["uid"] not in seen_uids]
        for p in new:
            for b in stale_states(p):
                violations.append(f"+{now - evicted_at:.1f}s {p['metadata']['name']} "
                                  f"(uid {p['metadata']['uid']}): {b}")
        every_new_runs = (len(current) == 2 and len(new) == 2
                          and all(running(p) and not p["metadata"].get("deletionTimestamp")
                                  for p in new))
        if every_new_runs and state.get("since") is None:
            state["since"] = now
            recoveries.append(now - evicted_at)
            up.log(f"{JOB}: both re-created pods run {now - evicted_at:.1f}s after the eviction")
        if not every_new_runs:
            state["since"] = None
        if (state.get("since") is not None and status.get("phase") == "Restarting"
                and now - state["since"] > SETTLE_SECONDS):
            violations.append(f"+{now - evicted_at:.1f}s phase Restarting "
                              f"{now - state['since']:.1f}s after every new pod ran "
                              f"(ready {status.get('ready')})")
        return status

    try:
        for target, victim in EVICTIONS:
            def training() -> bool:
                status = job().get("status") or {}
                assert status.get("phase") not in ("Failed", "Succeeded"), (
                    f"the job ended before step {target}; recoveries seen {recoveries}; "
                    f"violations: {violations[:20]}; status {status}")
                return (int((status.get("progress") or {}).get("step", 0)) >= target
                        and status.get("phase") == "Running"
                        and len([p for p in pods() if running(p)]) == 2)
            nh.eventually(f"step {target} with both replicas running", training,
                          up.TRAIN_DEADLINE, 0.5)
            seen_uids.update(p["metadata"]["uid"] for p in pods())
            evicted_at = time.monotonic()
            node.api.call("POST", f"/api/v1/namespaces/{NS}/pods/{JOB}-{victim}/eviction", {
                "apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": f"{JOB}-{victim}", "namespace": NS}})
            up.log(f"{JOB}: evicted {JOB}-{victim}")
            state: dict = {}
            deadline = time.monotonic() + up.TRAIN_DEADLINE
            # Until both new pods have run for longer than SETTLE_SECONDS (or the job ended).
            while time.monotonic() < deadline:
                status = sample(evicted_at, state)
                if status.get("phase") in ("Succeeded", "Failed") or (
                        state.get("since") is not None
                        and time.monotonic() - state["since"] > 2 * SETTLE_SECONDS):
                    break
                time.sleep(0.2)
        def trains_on() -> bool:
            status = job().get("status") or {}
            assert status.get("phase") not in ("Failed", "Succeeded"), status
            return (int((status.get("progress") or {}).get("step", 0)) >= FINAL_STEP
                    and status.get("phase") == "Running")
        nh.eventually(f"step {FINAL_STEP} after the last recovery", trains_on,
                      up.TRAIN_DEADLINE, 0.5)
        status = job()["status"]
        assert len(recoveries) == len(EVICTIONS), f"recoveries seen: {recoveries}"
        assert not violations, "\n".join(violations[:20])
        up.log(f"{JOB}: recovered in {', '.join(f'{r:.1f}' for r in recoveries)} s; status "
               f"{json.dumps({k: status.get(k) for k in ('restartCount', 'preemptionCount')})}")
    except BaseException:
        print(up.dump_on_failure(node, JOB, NS))
        raise
    up.kubectl(node, "delete", "trainingjob", JOB, "-n", NS, "--wait=true")
    nh.eventually(f"{JOB}'s pods gone", lambda: not pods(), up.TRAIN_DEADLINE, 0.5)
