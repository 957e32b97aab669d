"""``python -m fastmetal.distributed.run``: start the ranks of a data-parallel job, as
``torchrun``.

    python -m fastmetal.distributed.run --nproc-per-node N script.py args...
    python -m fastmetal.distributed.run --nnodes 2 --node-rank R --nproc-per-node N \\
        --master-addr HOST --master-port P script.py args...      (on each machine)

Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
FASTMETAL_DEVICE (``--device``, else FASTMETAL_DEVICE, else the default device) and, on a
CUDA device, CUDA_VISIBLE_DEVICES naming its own GPU (on the CPU, FASTMETAL_NUM_THREADS
splits the cores between the node's ranks unless set).

Node 0's launcher serves the rendezvous store at MASTER_ADDR:MASTER_PORT (the ranks' MPI
port name or NCCL id, and the launchers' news). Each rank runs under the MPICH ``mpiexec
-n 1`` found beside this Python or on PATH (MPICH's separately started processes can only
join one MPI world that way; ``--no-mpiexec`` or FASTMETAL_LAUNCH_MPIEXEC=0 turns it off).

If a rank exits with an error, its launcher stops the node's other ranks (SIGTERM, then
SIGKILL after a grace period), tells the other launchers through the store (they stop
theirs), prints the rank's last stderr lines and exits with its code: never a hang.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Optional

from ..ops.devices import default_device, device_capabilities
from .store import StoreClient, StoreServer

GRACE_S = 5.0        # SIGTERM to SIGKILL
POLL_S = 0.05
TAIL_LINES = 20      # a failed rank's stderr lines repeated in the summary
PROG = "fastmetal.distributed.run"


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1,
                    help="ranks on this node (default 1)")
    ap.add_argument("--nnodes", type=int, default=1, help="nodes (launchers) in all")
    ap.add_argument("--node-rank", "--node_rank", type=int, default=0,
                    help="this node's index, 0 .. nnodes - 1")
    ap.add_argument("--master-addr", "--master_addr", default="127.0.0.1",
                    help="node 0's address (default 127.0.0.1)")
    ap.add_argument("--master-port", "--master_port", type=int, default=None,
                    help="the rendezvous port on node 0 (default: a free port on one node, "
                         "29500 on several)")
    ap.add_argument("--device", default=None,
                    help="fastmetal device of every rank (default: FASTMETAL_DEVICE, else "
                         "the default device)")
    ap.add_argument("--no-mpiexec", action="store_true",
                    help="start ranks directly, not each under MPICH's mpiexec -n 1")
    ap.add_argument("-m", "--module", action="store_true",
                    help="run the script argument as a module (python -m)")
    ap.add_argument("script", help="the training script (or module, with -m)")
    ap.add_argument("script_args", nargs=argparse.REMAINDER)
    ns = ap.parse_args(argv)
    for name in ("nproc_per_node", "nnodes"):
        if getattr(ns, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(ns, name)}")
    if not 0 <= ns.node_rank < ns.nnodes:
        ap.error(f"--node-rank must be in 0 .. {ns.nnodes - 1}, got {ns.node_rank}")
    if ns.master_port is None:
        ns.master_port = _free_port() if ns.nnodes == 1 else 29500
    return ns


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def hydra_mpiexec() -> Optional[str]:
    """MPICH's mpiexec (Hydra) beside this Python or on PATH; None if there is none."""
    if os.environ.get("FASTMETAL_LAUNCH_MPIEXEC", "1") == "0":
        return None
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    for exe in (here, shutil.which("mpiexec")):
        if exe and os.path.exists(exe):
            try:
                out = subprocess.run([exe, "--version"], capture_output=True, text=True,
                                     timeout=20).stdout
            except (OSError, subprocess.TimeoutExpired):
                continue
            if "HYDRA" in out:
                return exe
    return None


def rank_environments(ns: argparse.Namespace, device: str, caps: dict) -> list:
    """One environment per local rank."""
    n = ns.nproc_per_node
    world = ns.nnodes * n
    base = dict(os.environ)
    common = {"WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(n),
              "MASTER_ADDR": ns.master_addr, "MASTER_PORT": str(ns.master_port),
              "GROUP_RANK": str(ns.node_rank), "FASTMETAL_DEVICE": device,
              "FASTMETAL_STORE_HOSTED": "1", "PYTHONUNBUFFERED": "1"}
    gpus: Optional[list] = None
    if caps.get("cuda_array_interface"):  # a CUDA GPU: one per rank
        listed = base.get("CUDA_VISIBLE_DEVICES")
        gpus = [g for g in listed.split(",") if g] if listed else [str(i) for i in range(n)]
        if len(gpus) < n:
            raise SystemExit(f"[{PROG}] expected at least {n} GPUs for --nproc-per-node {n}, "
                             f"got CUDA_VISIBLE_DEVICES={listed!r}")
    elif "FASTMETAL_NUM_THREADS" not in base and n > 1:
        common["FASTMETAL_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // n))
    envs = []
    for local in range(n):
        env = dict(base, **common, RANK=str(ns.node_rank * n + local), LOCAL_RANK=str(local))
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus[local]
        envs.append(env)
    return envs


class _Rank:
    def __init__(self, rank: int, local: int, cmd: list, env: dict) -> None:
        self.rank, self.local = rank, local
        self.tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
        self.proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE,
                                     start_new_session=True)
        self.reader = threading.Thread(target=self._forward, daemon=True)
        self.reader.start()

    def _forward(self) -> None:
        assert self.proc.stderr is not None
        for raw in iter(self.proc.stderr.readline, b""):
            self.tail.append(raw.decode(errors="replace").rstrip("\n"))
            try:
                sys.stderr.buffer.write(raw)
                sys.stderr.flush()
            except (OSError, ValueError):
                pass

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)  # the rank and its mpiexec: one session
        except (ProcessLookupError, PermissionError):
            pass


def _stop(ranks: list) -> None:
    for r in ranks:
        if r.proc.poll() is None:
            r.signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for r in ranks:
        try:
            r.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for r in ranks:
        r.signal(signal.SIGKILL)  # the session too: a wrapper's children may outlive it
        try:
            r.proc.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            pass


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code


def main(argv: Optional[list] = None) -> int:
    ns = parse_args(argv)
    device = ns.device or os.environ.get("FASTMETAL_DEVICE") or default_device()
    try:
        caps = device_capabilities(device)
    except ValueError as e:
        print(f"[{PROG}] expected --device (or FASTMETAL_DEVICE) to name a device of this "
              f"machine, got {device!r}: {e}", file=sys.stderr)
        return 2
    envs = rank_environments(ns, device, caps)
    server: Optional[StoreServer] = None
    main_client: Optional[StoreClient] = None  # a later node's line to node 0's store
    watch_client: Optional[StoreClient] = None  # the same, blocked waiting for "abort"
    if ns.node_rank == 0:
        try:
            server = StoreServer(ns.master_addr, ns.master_port)
        except OSError as e:
            print(f"[{PROG}] expected to serve the rendezvous at {ns.master_addr}:"
                  f"{ns.master_port}, got {e} (pick another --master-port)", file=sys.stderr)
            return 1
    else:
        main_client = StoreClient(ns.master_addr, ns.master_port, timeout=300)
        watch_client = StoreClient(ns.master_addr, ns.master_port, timeout=30)
    problem = _check_nodes(ns, server, main_client)
    if problem:
        print(f"[{PROG}] {problem}", file=sys.stderr)
        _tell(server, main_client, "abort", problem)
        _close(server, main_client, watch_client)
        return 1
    exe = None if ns.no_mpiexec else hydra_mpiexec()
    target = ["-m", ns.script] if ns.module else [ns.script]
    cmd = [sys.executable, "-u", *target, *ns.script_args]
    if exe is not None:
        cmd = [exe, "-n", "1", *cmd]

    remote_abort: list = []
    finished = threading.Event()

    def watch(c: StoreClient) -> None:  # another node's rank failed, or node 0 is gone
        try:
            msg = c.get("abort", 1e9)
        except (OSError, RuntimeError) as e:
            msg = None if finished.is_set() else f"lost node 0's launcher ({e})"
        if msg and not finished.is_set():
            remote_abort.append(msg)

    if watch_client is not None:
        threading.Thread(target=watch, args=(watch_client,), daemon=True).start()

    def on_signal(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: we are stopping already
        raise KeyboardInterrupt(signum)

    signal.signal(signal.SIGTERM, on_signal)
    ranks = [_Rank(int(env["RANK"]), local, cmd, env) for local, env in enumerate(envs)]
    failure: Optional[tuple] = None
    try:
        while True:
            codes = [r.proc.poll() for r in ranks]
            bad = [(r, c) for r, c in zip(ranks, codes) if c not in (None, 0)]
            if bad:
                failure = bad[0]
                break
            if server is not None:
                msg = server.get("abort", 0)
                if msg:
                    remote_abort.append(msg)
            if remote_abort:
                break
            if all(c == 0 for c in codes):
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        _stop(ranks)
        print(f"[{PROG}] interrupted: stopped every rank", file=sys.stderr)
        return 130
    if failure is not None:
        r, code = failure
        for rr in ranks:
            rr.reader.join(1.0)
        lines = "\n".join(f"  {line}" for line in r.tail) or "  (nothing on stderr)"
        summary = (f"rank {r.rank} (node {ns.node_rank}, local rank {r.local}) exited with "
                   f"code {code}; its last stderr lines:\n{lines}")
        _tell(server, main_client, "abort", summary)
        _stop(ranks)
        print(f"[{PROG}] {summary}\n[{PROG}] stopped the other ranks", file=sys.stderr)
        _close(server, main_client, watch_client)
        return _exit_code(code) or 1
    if remote_abort:
        _stop(ranks)
        print(f"[{PROG}] another node failed: {remote_abort[0]}\n[{PROG}] stopped this node's "
              "ranks", file=sys.stderr)
        _close(server, main_client, watch_client)
        return 1
    for r in ranks:
        r.reader.join(5.0)
    finished.set()
    _tell(server, main_client, f"done/{ns.node_rank}", "0")
    if server is not None:  # keep serving until every node is done (they watch the store)
        for node in range(1, ns.nnodes):
            while server.get(f"done/{node}", 1.0) is None:
                if server.get("abort", 0):
                    print(f"[{PROG}] another node failed: {server.get('abort', 0)}",
                          file=sys.stderr)
                    _close(server, main_client, watch_client)
                    return 1
    _close(server, main_client, watch_client)
    return 0


def _check_nodes(ns: argparse.Namespace, server: Optional[StoreServer],
                 client: Optional[StoreClient]) -> Optional[str]:
    """Every launcher of the job was started with the same --nnodes and --nproc-per-node
    (else the ranks would wait for ranks that never come); what differs, else None."""
    mine = json.dumps([ns.nnodes, ns.nproc_per_node])
    store: Any = server if server is not None else client
    store.set(f"launcher/{ns.node_rank}", mine)
    deadline = time.monotonic() + float(os.environ.get("FASTMETAL_DIST_TIMEOUT", "300"))
    for node in range(ns.nnodes):
        got = store.get(f"launcher/{node}", max(0.0, deadline - time.monotonic()))
        if got is None:
            return f"expected node {node}'s launcher within the timeout, got none"
        if got != mine:
            theirs = json.loads(got)
            return (f"expected every node started with --nnodes {ns.nnodes} --nproc-per-node "
                    f"{ns.nproc_per_node}, got --nnodes {theirs[0]} --nproc-per-node "
                    f"{theirs[1]} on node {node}")
    return None


def _tell(server: Optional[StoreServer], client: Optional[StoreClient], key: str,
          value: str) -> None:
    try:
        if server is not None:
            server.set(key, value)
        elif client is not None:
            client.set(key, value)
    except (OSError, RuntimeError):
        pass  # node 0's launcher is gone: nothing to tell


def _close(server: Optional[StoreServer], *clients: Optional[StoreClient]) -> None:
    for c in clients:
        if c is not None:
            c.close()
    if server is not None:
        time.sleep(0.2)  # let the other launchers read the last news
        server.close()


if __name__ == "__main__":
    sys.exit(main())
