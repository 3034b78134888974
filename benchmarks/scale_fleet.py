"""Fleet scale: N members of the real fleet code against a real etcd (issue 35).

Each member is a real :class:`~adaptd.fleet.agent.FleetAgent` (the daemon's own agent,
session, slot table and failure records; no TensorFlow, no daemon loop), with its own
lease, its own HTTP connection to etcd and its own thread. ``--procs`` processes hold
N/procs members each (a process is a few hundred "hosts" as far as etcd can tell), so a
SIGKILL of one process kills its members the way a host's crash would. etcd is started
here by ``scripts/local_etcd.py`` (one member, or three with ``--etcd-members 3``).

The workload, per N (a fresh etcd each):

1. **join**: every member opens its session (lease, member key) and publishes its
   failure record; the harness waits until all are up;
2. **idle** (``--idle-s``): nothing happens; etcd's own ``/metrics`` give requests/s,
   bytes/s and its CPU, ``/proc`` the members' CPU;
3. **knowledge**: one member publishes a new failure record; the time until every
   member's view holds it;
4. **storm**: every member wants a slot on ONE shared target (cap ``c`` = N /
   ``--per-slot``) at once and releases it ``--save-s`` after its grant; measured:
   the drain time (first want to last release) against the ideal N/c × save time,
   each grant's latency after the release that freed its slot (the k-th grant after
   the first c pairs with the (k-c)-th release, both on the machine's one monotonic
   clock), transaction conflicts per grant, etcd requests and bytes per second. With
   ``--targets K`` the members are spread over K shared targets (member i on target
   i % K, cap N / K / ``--per-slot`` each, the same ideal): what a claim or a grant on
   one target costs the grants on the others;
5. **kill**: a member of the last process holds a slot (cap 1) on another target, a
   member of the first waits for it; the last process is SIGKILLed; the time until the
   waiter holds the slot (lease TTL), then the killed process's members come back and
   the time until all are up again.

Every wait has a deadline; a phase that misses its deadline is reported as such (the
harness saturated, or the design did not keep up) and the next N is not run.

Usage::

    python benchmarks/scale_fleet.py --hosts 50,200 --json out.json
    nice -n 10 python benchmarks/scale_fleet.py --hosts 500,1000 --skip storm,kill
    python benchmarks/scale_fleet.py plot --runs before=a.json after=b.json --out docs/x.png

Needs etcd (Debian etcd-server) and the fleet extra (etcd3gw). Not part of the test
suite; tests/fleet/test_fleet_scale.py runs its N = 50 case and asserts on request
counts, not on timings.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import math
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

STORM_TARGET = "shared-nfs"
KILL_TARGET = "kill-target"
GPU_MODEL = "H100"


# ---------------------------------------------------------------------- member side


def member_main(args: argparse.Namespace) -> int:
    """One process of ``args.count`` members: commands on stdin, JSON events on stdout."""
    from adaptd.fleet import agent as agent_module
    from adaptd.fleet.agent import FleetAgent
    from adaptd.fleet.failures import FailureRecord
    from adaptd.fleet.session import FleetSettings
    from adaptd.fleet.slots import SlotTable

    if args.queue_every_s > 0:
        # a shorter period of the claims' read, so that a storm this box can hold spans
        # as many periods as a long one of real saves (the same for before and after)
        agent_module.QUEUE_EVERY_S = args.queue_every_s

    urls = args.urls.split(",")
    out_lock = threading.Lock()
    # every read of the claims by this process's members, and the claims it returned: the
    # storm's N² term (issue 35) counted at its source, whatever etcd's bytes mix in
    claim_reads = {"reads": 0, "claims": 0}
    table_read = SlotTable.read

    def counted_read(self: SlotTable, *a: Any, **kw: Any) -> Any:
        out = table_read(self, *a, **kw)
        with out_lock:
            claim_reads["reads"] += 1
            claim_reads["claims"] += len(out[0])
        return out

    SlotTable.read = counted_read  # type: ignore[method-assign]

    def emit(**event: Any) -> None:
        with out_lock:
            sys.stdout.write(json.dumps(event) + "\n")
            sys.stdout.flush()

    releases: list[tuple[float, str]] = []  # heap of (due, host)
    rel_cv = threading.Condition()
    agents: dict[str, FleetAgent] = {}
    granted_at: dict[str, float] = {}
    storm: dict[str, Any] = {}

    def on_grant(host: str) -> None:
        agent = agents.get(host)
        if agent is None:
            return
        view = agent.view()
        now = time.monotonic()
        for job in view.granted:
            key = f"{host}/{job}"
            if key in granted_at:
                continue
            granted_at[key] = now
            target = storm.get("targets", {}).get(host, "") if job == "storm" else ""
            emit(ev="grant", host=host, job=job, target=target, t=now)
            if job == "storm":
                with rel_cv:
                    heapq.heappush(releases, (now + storm["save_s"], host))
                    rel_cv.notify()

    def releaser() -> None:
        while True:
            with rel_cv:
                while not releases or releases[0][0] > time.monotonic():
                    rel_cv.wait(None if not releases else releases[0][0] - time.monotonic())
                _due, host = heapq.heappop(releases)
            agents[host].release("storm")
            target = storm.get("targets", {}).get(host, "")
            emit(ev="release", host=host, target=target, t=time.monotonic())

    threading.Thread(target=releaser, daemon=True).start()
    hosts = [f"h{i:05d}" for i in range(args.first, args.first + args.count)]
    for i, host in enumerate(hosts):
        k = (args.first + i) % len(urls)  # spread hosts over the etcd members
        settings = FleetSettings(
            endpoints=tuple(urls[k:] + urls[:k]), host=host, prefix=args.prefix,
            lease_ttl_s=args.ttl,
        )  # fmt: skip
        agents[host] = FleetAgent(settings, poll_s=args.poll_s, on_grant=lambda h=host: on_grant(h))
    t_start = time.monotonic()
    for i, agent in enumerate(agents.values()):
        if args.join_rate > 0:  # a fleet restarted in waves, not all at once
            time.sleep(max(0.0, t_start + i / args.join_rate - time.monotonic()))
        agent.start()
    for host, agent in agents.items():
        agent.publish(FailureRecord(host, GPU_MODEL, gpu_seconds=3600.0, failures=1.0,
                                    lifetimes=(1800.0,), updated=time.time()))  # fmt: skip
    deadline = time.monotonic() + args.up_deadline_s
    for agent in agents.values():
        agent.wait_for(lambda v: v.up, max(0.1, deadline - time.monotonic()))
    import adaptd

    emit(ev="up", n=len(agents), t=time.monotonic(), adaptd=str(Path(adaptd.__file__).parent))

    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        cmd = words[0]
        if cmd == "publish":  # publish HOST MODEL
            host, model = words[1], words[2]
            agents[host].publish(FailureRecord(host, model, gpu_seconds=1.0, updated=time.time()))
            emit(ev="published", t=time.monotonic())
        elif cmd == "await_record":  # await_record MODEL DEADLINE_S
            model, limit = words[1], float(words[2])
            threading.Thread(
                target=_await_record, args=(agents, model, limit, emit), daemon=True
            ).start()
        elif cmd == "storm":  # storm CAP SAVE_S SEED [TARGETS]: host i on target i % TARGETS
            cap, storm["save_s"], seed = int(words[1]), float(words[2]), int(words[3])
            spread = int(words[4]) if len(words) > 4 else 1
            storm["targets"] = {
                h: STORM_TARGET if spread == 1 else f"{STORM_TARGET}-{int(h[1:]) % spread}"
                for h in agents
            }
            for host, agent in agents.items():
                risk = random.Random(f"{seed}/{host}").uniform(0.0, 1000.0)
                target = storm["targets"][host]
                agent.want("storm", target, cap=cap, at_risk_gpu_s=risk, gpus=1)
            emit(ev="wanted", t=time.monotonic())
        elif cmd == "want":  # want HOST JOB TARGET CAP
            host, job, target, cap = words[1], words[2], words[3], int(words[4])
            agents[host].want(job, target, cap=cap, at_risk_gpu_s=1.0, gpus=1)
        elif cmd == "stats":
            views = [a.view() for a in agents.values()]
            emit(
                ev="stats",
                up=sum(v.up for v in views),
                grants=sum(v.grants for v in views),
                conflicts=sum(v.conflicts for v in views),
                errors=sum(v.errors for v in views),
                rejoins=sum(v.rejoins for v in views),
                **claim_reads,
            )
        elif cmd == "quit":
            break
    for agent in agents.values():
        agent.stop(timeout_s=2.0)
    return 0


def _await_record(agents: dict[str, Any], model: str, limit: float, emit: Any) -> None:
    """Report when every member here has read the record of ``model`` (50 ms sampling)."""
    deadline = time.monotonic() + limit
    left = set(agents)
    last = 0.0
    while left and time.monotonic() < deadline:
        now = time.monotonic()
        for host in list(left):
            if any(r.gpu_model == model for r in agents[host].view().records):
                left.discard(host)
                last = now
        if left:
            time.sleep(0.05)  # a sampling period, not a wait for an event
    emit(ev="record_seen", missing=len(left), t=last)


# ---------------------------------------------------------------------- driver side


class Members:
    """One member process: its stdin for commands, its events queued as they come."""

    def __init__(self, args: argparse.Namespace, urls: list[str], first: int, count: int):
        self.first, self.count = first, count
        cmd = [
            sys.executable, __file__, "member", "--urls", ",".join(urls), "--prefix",
            args.prefix, "--first", str(first), "--count", str(count), "--ttl", str(args.ttl),
            "--poll-s", str(args.poll_s), "--up-deadline-s", str(args.up_deadline_s),
            "--join-rate", str(args.join_rate / max(1, args.procs)),
            "--queue-every-s", str(args.queue_every_s),
        ]  # fmt: skip
        # a PYTHONPATH given (an older tree laid out for a "before") comes first: with
        # this checkout first, such a "before" ran this checkout's code (issue 35, the
        # fourth pass's before rows); each run's figures name the adaptd that ran
        given = os.environ.get("PYTHONPATH", "")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (given, str(REPO)) if p)}
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.events.put(json.loads(line))
        self.events.put({"ev": "exit"})

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    def next(self, kind: str, deadline: float, **match: Any) -> dict[str, Any]:
        """The next event of ``kind`` whose fields equal ``match`` (others are dropped);
        raises TimeoutError."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {kind!r} {match} from members {self.first}+{self.count}")
            try:
                e = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if e["ev"] == kind and all(e.get(k) == v for k, v in match.items()):
                return e
            if e["ev"] == "exit":
                raise TimeoutError(f"members {self.first}+{self.count} exited")

    def cpu_s(self) -> float:
        return _proc_cpu_s(self.proc.pid)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        self.send("quit")
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (from /proc; 0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class EtcdFigures:
    """Counters from etcd's /metrics, summed over its members."""

    requests: float = 0.0  # gRPC calls started (unary and streams: every gateway request)
    by_method: dict[str, float] = field(default_factory=dict)
    sent_bytes: float = 0.0
    received_bytes: float = 0.0
    cpu_s: float = 0.0
    db_bytes: float = 0.0
    keys: float = 0.0

    def minus(self, before: EtcdFigures) -> EtcdFigures:
        return EtcdFigures(
            self.requests - before.requests,
            {m: v - before.by_method.get(m, 0.0) for m, v in self.by_method.items()},
            self.sent_bytes - before.sent_bytes,
            self.received_bytes - before.received_bytes,
            self.cpu_s - before.cpu_s,
            self.db_bytes,
            self.keys,
        )


def etcd_figures(urls: list[str]) -> EtcdFigures:
    """Read and sum the counters of every member's ``/metrics``."""
    total: dict[str, float] = {}
    methods: dict[str, float] = {}
    for url in urls:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
            text = r.read().decode()
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name, value = line.rsplit(" ", 1)
            metric = name.split("{", 1)[0]
            v = float(value)
            if metric == "grpc_server_started_total":
                method = name.split('grpc_method="', 1)[1].split('"', 1)[0]
                methods[method] = methods.get(method, 0.0) + v
            total[metric] = total.get(metric, 0.0) + v
    return EtcdFigures(
        requests=total.get("grpc_server_started_total", 0.0),
        by_method=methods,
        sent_bytes=total.get("etcd_network_client_grpc_sent_bytes_total", 0.0),
        received_bytes=total.get("etcd_network_client_grpc_received_bytes_total", 0.0),
        cpu_s=total.get("process_cpu_seconds_total", 0.0),
        db_bytes=total.get("etcd_mvcc_db_total_size_in_use_in_bytes", 0.0) / max(1, len(urls)),
        keys=total.get("etcd_debugging_mvcc_keys_total", 0.0) / max(1, len(urls)),
    )


@contextlib.contextmanager
def etcd_cluster(members: int) -> Iterator[list[str]]:
    from local_etcd import cluster, running

    with tempfile.TemporaryDirectory(prefix="scale-etcd-") as tmp:
        if members == 1:
            with running(Path(tmp)) as server:
                yield [server.url]
        else:
            with cluster(Path(tmp), members) as nodes:
                yield [n.url for n in nodes]


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


class Window:
    """etcd's counters and the members' CPU over one phase."""

    def __init__(self, urls: list[str], procs: list[Members]) -> None:
        self.urls, self.procs = urls, procs
        self.t0 = time.monotonic()
        self.etcd0 = etcd_figures(urls)
        self.cpu0 = sum(p.cpu_s() for p in procs)

    def close(self, n: int) -> dict[str, Any]:
        dt = time.monotonic() - self.t0
        d = etcd_figures(self.urls).minus(self.etcd0)
        cpu = sum(p.cpu_s() for p in self.procs) - self.cpu0
        top = sorted(d.by_method.items(), key=lambda kv: -kv[1])[:5]
        return {
            "seconds": round(dt, 2),
            "requests_per_s": round(d.requests / dt, 1),
            "requests_per_host_s": round(d.requests / dt / n, 3),
            "by_method_per_s": {m: round(v / dt, 1) for m, v in top if v},
            "bytes_per_s": round((d.sent_bytes + d.received_bytes) / dt),
            "etcd_cpu": round(d.cpu_s / dt, 3),
            "members_cpu": round(cpu / dt, 3),
            "db_bytes": d.db_bytes,
        }


def run_n(n: int, args: argparse.Namespace, urls: list[str]) -> dict[str, Any]:
    """The workload of the module docstring at ``n`` members; returns its figures."""
    per = math.ceil(n / args.procs)
    procs = [Members(args, urls, i, min(per, n - i)) for i in range(0, n, per)]
    out: dict[str, Any] = {"hosts": n, "procs": len(procs), "etcd_members": len(urls)}
    try:
        t0 = time.monotonic()
        deadline = t0 + args.up_deadline_s + 10
        out["adaptd"] = sorted({p.next("up", deadline).get("adaptd", "?") for p in procs})
        out["join_s"] = round(time.monotonic() - t0, 2)
        # let the initial publications and first reads settle, then measure idle
        _settle(args.ttl / 3 + 1)
        w = Window(urls, procs)
        _settle(args.idle_s)
        out["idle"] = w.close(n)

        # knowledge: one new record, the time until every member read it
        model = f"new-{n}"
        limit = args.record_deadline_s
        for p in procs:
            p.send(f"await_record {model} {limit}")
        t_pub = time.monotonic()
        procs[0].send(f"publish h{procs[0].first:05d} {model}")
        seen = [p.next("record_seen", t_pub + limit + 10) for p in procs]
        missing = sum(e["missing"] for e in seen)
        out["record_to_all_s"] = (
            round(max(e["t"] for e in seen) - t_pub, 2) if not missing else None
        )
        out["record_missing"] = missing

        if "storm" not in args.skip:
            out["storm"] = storm(n, args, urls, procs)
        if "kill" not in args.skip:
            out["kill"] = kill_and_return(args, urls, procs)
        out["db_bytes"] = etcd_figures(urls).db_bytes
        out["keys"] = etcd_figures(urls).keys
    except TimeoutError as exc:
        out["stopped"] = str(exc)
    finally:
        for p in procs:
            p.close()
    return out


def _settle(seconds: float) -> None:
    """A measurement window: the time itself is what is measured over."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 1.0))


def storm(n: int, args: argparse.Namespace, urls: list[str], procs: list[Members]) -> dict:
    k = args.targets  # the storm's targets; each with its share of the members and a cap
    cap = max(1, math.ceil(n / k / args.per_slot))
    ideal = n / k / cap * args.save_s
    for p in procs:
        p.send("stats")
    before = [p.next("stats", time.monotonic() + 30) for p in procs]
    w = Window(urls, procs)
    t0 = time.monotonic()
    for p in procs:
        p.send(f"storm {cap} {args.save_s} {args.seed} {k}")
    deadline = t0 + ideal * args.storm_factor + 20
    grants: dict[str, list[float]] = {}
    releases: dict[str, list[float]] = {}
    done = False
    while not done and time.monotonic() < deadline:
        for p in procs:
            while True:
                try:
                    e = p.events.get_nowait()
                except queue.Empty:
                    break
                if e["ev"] == "grant" and e["job"] == "storm":
                    grants.setdefault(e.get("target", ""), []).append(e["t"])
                elif e["ev"] == "release":
                    releases.setdefault(e.get("target", ""), []).append(e["t"])
        done = sum(map(len, releases.values())) >= n
        if not done:
            time.sleep(0.05)  # collecting events from n members' pipes
    window = w.close(n)
    for p in procs:
        p.send("stats")
    after = [p.next("stats", time.monotonic() + 30) for p in procs]
    lat = []  # per target: its k-th grant after the first cap pairs with its (k - cap)-th release
    for target, got in grants.items():
        got.sort()
        freed = sorted(releases.get(target, []))
        lat += [got[i] - freed[i - cap] for i in range(cap, len(got)) if i - cap < len(freed)]
    new_grants = sum(a["grants"] - b["grants"] for a, b in zip(after, before, strict=True))
    conflicts = sum(a["conflicts"] - b["conflicts"] for a, b in zip(after, before, strict=True))
    drain = (max(max(r) for r in releases.values()) - t0) if done else None
    span = max(1e-9, window["seconds"])
    pairs = list(zip(after, before, strict=True))
    reads = sum(a.get("reads", 0) - b.get("reads", 0) for a, b in pairs)
    claims = sum(a.get("claims", 0) - b.get("claims", 0) for a, b in pairs)
    return {
        "cap": cap,
        "targets": k,
        "save_s": args.save_s,
        "ideal_s": round(ideal, 2),
        "drain_s": round(drain, 2) if drain is not None else None,
        "drain_vs_ideal": round(drain / ideal, 3) if drain is not None else None,
        "drained": sum(map(len, releases.values())),
        "grant_p50_s": _r(_pct(lat, 0.5)),
        "grant_p99_s": _r(_pct(lat, 0.99)),
        "grant_max_s": _r(max(lat) if lat else None),
        "conflicts_per_grant": round(conflicts / max(1, new_grants), 3),
        "claim_reads_per_host": round(reads / n, 2),
        "claims_read_per_s": round(claims / span, 1),
        **{f"storm_{k}": v for k, v in window.items()},
    }


def kill_and_return(args: argparse.Namespace, urls: list[str], procs: list[Members]) -> dict:
    """A member of the last process holds the kill target's one slot; the process is
    SIGKILLed; how long until a member of the first process holds it; then the killed
    members come back."""
    victim, waiter = procs[-1], procs[0]
    vh, wh = f"h{victim.first:05d}", f"h{waiter.first:05d}"
    victim.send(f"want {vh} kill {KILL_TARGET} 1")
    victim.next("grant", time.monotonic() + 30, host=vh, job="kill")
    waiter.send(f"want {wh} kill {KILL_TARGET} 1")
    _settle(1.0)  # the waiter has queued its claim
    t_kill = time.monotonic()
    victim.kill()
    g = waiter.next("grant", t_kill + args.ttl + 15, host=wh, job="kill")
    freed = g["t"] - t_kill
    t_back = time.monotonic()
    procs[-1] = Members(args, urls, victim.first, victim.count)
    procs[-1].next("up", t_back + args.up_deadline_s + 10)
    return {
        "ttl_s": args.ttl,
        "slot_freed_s": round(freed, 2),
        "back_up_s": round(time.monotonic() - t_back, 2),
        "killed_members": victim.count,
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def driver(args: argparse.Namespace) -> int:
    results = []
    load0 = os.getloadavg()
    for n in [int(x) for x in args.hosts.split(",")]:
        with etcd_cluster(args.etcd_members) as urls:
            t = time.monotonic()
            r = run_n(n, args, urls)
            r["wall_s"] = round(time.monotonic() - t, 1)
            r["loadavg"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(r), flush=True)
        results.append(r)
        if "stopped" in r:
            print(f"stopped at N={n}: {r['stopped']}", file=sys.stderr)
            break
    summary = {"args": vars(args), "load_before": load0, "runs": results}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0


#: The figures drawn and fitted: (label, how to get it from one run, unit).
CURVES: tuple[tuple[str, str, str], ...] = (
    ("idle etcd requests/s per host", "idle.requests_per_host_s", "req/s"),
    ("idle etcd bytes/s", "idle.bytes_per_s", "B/s"),
    ("storm etcd requests/s per host", "storm.storm_requests_per_host_s", "req/s"),
    ("storm etcd bytes/s", "storm.storm_bytes_per_s", "B/s"),
    ("storm drain / ideal", "storm.drain_vs_ideal", "×"),
    ("slot grant p99 after a release", "storm.grant_p99_s", "s"),
    ("transaction conflicts per grant", "storm.conflicts_per_grant", "per grant"),
    ("etcd CPU in a storm", "storm.storm_etcd_cpu", "cores"),
    ("members' CPU in a storm", "storm.storm_members_cpu", "cores"),
    ("new failure record at every member", "record_to_all_s", "s"),
)


def figure(run: dict[str, Any], path: str) -> float | None:
    v: Any = run
    for part in path.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return float(v) if isinstance(v, int | float) else None


def fit_power(ns: list[float], ys: list[float]) -> tuple[float, float] | None:
    """``y = a · N^b`` by least squares on logs (two points at least, all > 0)."""
    pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys, strict=True) if y > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return math.exp(my - b * mx), b


def plot(args: argparse.Namespace) -> int:
    """Curves against N of each ``--runs LABEL=FILE`` (before/after), the fitted power
    laws extrapolated to 10,000 hosts; a PNG and a table of the fits on stdout."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {}
    for item in args.runs:
        label, files = item.split("=", 1)
        runs = [
            r
            for file in files.split(",")
            for r in json.loads(Path(file).read_text())["runs"]
            if "idle" in r
        ]
        series[label] = sorted(runs, key=lambda r: r["hosts"])
    cols = 2
    rows = math.ceil(len(CURVES) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 3.0 * rows))
    fits: dict[str, Any] = {}
    far = [50, 100, 200, 500, 1000, 2000, 5000, 10000]
    for ax, (title, path, unit) in zip(axes.flat, CURVES, strict=False):
        for label, runs in series.items():
            pts = [(r["hosts"], figure(r, path)) for r in runs]
            pts = [(n, y) for n, y in pts if y is not None]
            if not pts:
                continue
            ns, ys = [n for n, _ in pts], [y for _, y in pts]
            (line,) = ax.plot(ns, ys, "o-", label=f"{label} (measured)")
            fit = fit_power(ns, ys) if label in args.fit or not args.fit else None
            if fit is not None:
                a, b = fit
                ext = [n for n in far if n >= min(ns)]
                ax.plot(ext, [a * n**b for n in ext], "--", color=line.get_color(), alpha=0.6,
                        label=f"{label} fit {a:.3g}·N^{b:.2f}")  # fmt: skip
                fits[f"{label}: {title}"] = {
                    "a": a, "b": b, "measured_to": max(ns),
                    "at_2000": a * 2000**b, "at_10000": a * 10000**b,
                }  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("hosts (N)", fontsize=8)
        ax.set_ylabel(unit, fontsize=8)
        ax.legend(fontsize=6)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    for name, f in fits.items():
        print(
            f"{name}: {f['a']:.4g}·N^{f['b']:.2f} (measured to N={f['measured_to']}): "
            f"{f['at_2000']:.3g} at 2,000, {f['at_10000']:.3g} at 10,000"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(fits, indent=1))
    return 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("mode", nargs="?", default="driver", choices=("driver", "member", "plot"))
    ap.add_argument("--hosts", default="50,200", help="comma-separated N")
    ap.add_argument("--procs", type=int, default=4, help="member processes")
    ap.add_argument("--etcd-members", type=int, default=1, choices=(1, 3))
    ap.add_argument("--ttl", type=int, default=10, help="lease TTL (the daemon's default)")
    ap.add_argument("--poll-s", type=float, default=0.5, help="the agent's poll (default 0.5)")
    ap.add_argument("--idle-s", type=float, default=20.0)
    ap.add_argument("--per-slot", type=int, default=25, help="cap c = ceil(N / per_slot)")
    ap.add_argument("--save-s", type=float, default=1.0)
    ap.add_argument(
        "--targets", type=int, default=1,
        help="storm targets: member i wants target i %% K, cap ceil(N / K / per_slot) each",
    )  # fmt: skip
    ap.add_argument("--storm-factor", type=float, default=3.0, help="storm deadline × ideal")
    ap.add_argument("--record-deadline-s", type=float, default=40.0)
    ap.add_argument("--up-deadline-s", type=float, default=120.0)
    ap.add_argument(
        "--join-rate", type=float, default=0.0,
        help="members started per second, all processes together (0: all at once, a herd)",
    )  # fmt: skip
    ap.add_argument(
        "--queue-every-s", type=float, default=0.0,
        help="the members' QUEUE_EVERY_S (0: the code's own, 30 s): a storm of short saves "
        "spans as many periods of the claims' read as a long storm of real saves",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument(
        "--skip", default="", help="phases left out, comma-separated: storm, kill (large N)"
    )
    ap.add_argument("--prefix", default="/adaptd/")
    ap.add_argument("--json", help="write every figure (plot: the fits) here")
    # plot
    ap.add_argument(
        "--runs", nargs="*", default=[], help="plot: LABEL=FILE.json[,FILE.json...] ..."
    )
    ap.add_argument("--out", default="docs/scale-fleet.png", help="plot: the PNG")
    ap.add_argument("--fit", nargs="*", default=[], help="plot: the labels to fit (default: all)")
    # member side
    ap.add_argument("--urls")
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--count", type=int, default=0)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.mode == "plot":
        return plot(args)
    return member_main(args) if args.mode == "member" else driver(args)


if __name__ == "__main__":
    sys.exit(main())
