"""The stand-in's nodes when they run pods (--kubelet, implied by --image
and --autoscaler): one kubelet for every Node object (nodes.py), running
each container of a pod bound to any of them as a local process group,
and the default scheduler's loop (scheduler.py) on the same thread.

What it does as the real ones do (the table at the top of
tests/integration/test_standin.c lists what is checked):
  - scheduling (scheduler.py): a pod without spec.nodeName is bound to a
    node that fits in a separate write (spec.nodeName + condition
    PodScheduled True), or left Pending with PodScheduled False, reason
    Unschedulable and the scheduler's message, and bound when room frees
    up; terminal pods do not count;
  - per node: the pod's hostIP (the node's InternalIP: 127.0.0.1 for the
    first, 127.0.0.(K+1) for standin-node-K), spec.nodeName in the
    downward API, the node as the Events' source host; a Node deleted is
    a machine gone: its containers are killed at once, its pods left to
    PodGC;
  - graceful node shutdown (admin reclaim, nodes.py): the node's pods get
    SIGTERM with the notice left as their grace period at most, phase
    Failed, reason Terminated, "Pod was terminated in response to
    imminent node shutdown.", DisruptionTarget True TerminationByKubelet;
    a pod bound meanwhile is rejected (Failed, NodeShutdown);
  - images: --image PATTERN=DIR[=ENTRYPOINT] maps image references
    (fnmatch) to a directory put first on the container's PATH; an image
    matching no pattern fails to "pull": ErrImagePull, then ImagePullBackOff,
    with the real back-off (10 s doubling to 5 min; --backoff shortens it);
  - the container: command replaces the entrypoint, args follow, $(VAR)
    expanded from the container's environment ($$ escapes); env from value,
    fieldRef, secretKeyRef, configMapKeyRef, resourceFieldRef and envFrom,
    a missing Secret/ConfigMap/key -> waiting CreateContainerConfigError
    with the kubelet's message, retried every 2 s; the service-account
    token, ca.crt and namespace written to a per-pod dir (RL_K8S_SA_DIR);
  - status through the API store on every change: phase, conditions
    (others' conditions kept, as PodScheduled and the eviction API's
    DisruptionTarget), containerStatuses (state, lastState, restartCount,
    ready, started), podIP (one 127.R.x.y per pod, not reused for a long
    while), hostIP;
    restartPolicy with CrashLoopBackOff back-off; logs per container
    instance, served by GET pods/<name>/log;
  - the termination message: a fresh empty file for every container
    instance (restarts too) stands for the one the kubelet mounts at
    terminationMessagePath; when the instance ends, whatever its exit
    status, terminated.message is the file's last 4096 bytes; only when
    the file is empty, terminationMessagePolicy FallbackToLogsOnError and
    the status not 0 is it the log's tail (80 lines, 2048 bytes); a pod's
    messages share 12 KiB in its status (each cut to 12288 / containers).
    The processes share the host's /dev, so nothing is mounted: the file
    is in the pod's dir and its host path in $RINGLEADER_TERMINATION_LOG,
    only for a container with the default path (/dev/termination-log); one
    asking for another path gets no variable and no message from a file;
  - OOMKilled: a container with resources.limits.memory (in whole bytes,
    rounded up; 0, or a quantity the API server would refuse: no limit) is
    measured every 100 ms on the kubelet's loop -- the anonymous resident
    memory of every process in its group (/proc statm: resident - shared;
    a cgroup would charge page cache too but reclaims it before OOM-
    killing) -- and, over the limit, SIGKILLed whole (memory.oom.group):
    terminated with reason OOMKilled, exitCode 137, then restartPolicy as
    for any exit. A spike shorter than the poll goes unseen, shared memory
    (tmpfs) is not counted; only containers with a limit are measured;
  - termination: SIGTERM to the container's main process -- only when it
    handles SIGTERM, since a container's PID 1 ignores signals it has no
    handler for -- SIGKILL to its whole group after the grace period or as
    soon as the main process is gone (the PID namespace ending); then the
    terminal phase (1.27+) and the final delete of the pod object;
  - kubelet eviction (admin API) with reason Evicted and condition
    DisruptionTarget (TerminationByKubelet);
  - native sidecars (initContainers with restartPolicy Always, 1.29+):
    started first, the other containers once every one runs (Initialized
    False until then, PodInitializing), restarted whatever the pod's
    restartPolicy, stopped with SIGTERM after the other containers ended
    (the pod's phase is theirs) or at a delete, reported in
    initContainerStatuses (spec order; containerStatuses sorted by name);
  - the service mesh's proxy image (docker.io/istio/proxyv2) is built in.

Processes never outlive the stand-in: its shutdown kills every group;
each child gets PR_SET_PDEATHSIG (SIGKILL) from a preexec_fn; a reaper
process (this file with --reaper) holds the list of process groups and
kills them when the stand-in's end of its pipe closes, even after a
SIGKILL of the stand-in."""

import base64
import copy
import ctypes
import fnmatch
import hashlib
import math
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from fractions import Fraction

from controllers import NODE_NAME, LocalNode
from k8slib import APIError, bad_request, now_rfc3339
from scheduler import Scheduler

PODS = ("", "pods")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NODES = ("", "nodes")
SANITIZER_ENV = ("ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS")
# The kubelet's graceful node shutdown (GracefulNodeShutdown, on by default)
SHUTDOWN_REASON = "Terminated"
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
# What the conditions the kubelet writes are; others (PodScheduled, an
# eviction's DisruptionTarget, readiness gates) it keeps as it finds them.
KUBELET_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
# The termination-message file: where the kubelet mounts it unless the
# container says otherwise, the most of it read (the last bytes: tail.
# ReadAtMost), and what a pod's messages may take together in its status
# (the status manager cuts each to this over the number of containers).
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
MAX_TERMINATION_MESSAGE = 4096
MAX_POD_TERMINATION_MESSAGES = 12 * 1024
# Where the stand-in tells a container its termination-message file is.
TERMINATION_LOG_ENV = "RINGLEADER_TERMINATION_LOG"
# How often the memory of containers with limits.memory is measured (s).
MEMORY_POLL = 0.1


# ---- pure helpers ------------------------------------------------------------------

def expand(s, lookup):
    """Kubernetes' $(VAR) expansion (third_party/forked/golang/expansion):
    $(NAME) -> its value when defined, else left as written; $$ -> $; a
    lone $ or an unclosed $( stays as it is."""
    out, i, n = [], 0, len(s)
    while i < n:
        ch = s[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = s[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            close = s.find(")", i + 2)
            if close < 0:
                out.append("$(")
                i += 2
            else:
                name = s[i + 2:close]
                v = lookup(name)
                out.append(v if v is not None else "$(" + name + ")")
                i = close + 1
        else:
            out.append("$" + nxt)
            i += 2
    return "".join(out)


def normalize_image(ref):
    """The reference containerd reports: docker.io/library/ prefixes for
    Docker Hub names and :latest when neither tag nor digest is given."""
    name = ref
    first = name.split("/", 1)[0]
    if "/" not in name or ("." not in first and ":" not in first and first != "localhost"):
        name = "docker.io/" + ("library/" + name if "/" not in name else name)
    last = name.rsplit("/", 1)[-1]
    if "@" not in last and ":" not in last:
        name += ":latest"
    return name


def go_duration(sec):
    """time.Duration's String(): 200ms, 10s, 1m20s, 5m0s."""
    if sec < 1:
        ms = sec * 1000
        return ("%d" % ms if ms == int(ms) else ("%.3f" % ms).rstrip("0").rstrip(".")) + "ms"
    h, rem = divmod(sec, 3600)
    m, s = divmod(rem, 60)
    ss = "%d" % s if s == int(s) else ("%.3f" % s).rstrip("0").rstrip(".")
    if h:
        return "%dh%dm%ss" % (h, m, ss)
    if m:
        return "%dm%ss" % (m, ss)
    return ss + "s"


ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


# resource.Quantity: a signed decimal number, then a binary (Ki..Ei) or
# decimal (n, u, m, k, M, G, T, P, E) suffix or a decimal exponent (e3, E-2).
QUANTITY = re.compile(r"^([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
QUANTITY_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
                   "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
                   "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def parse_quantity(q):
    """A resource.Quantity as an exact Fraction of its base unit (cores,
    bytes), or None where the API server's decoder refuses it."""
    m = QUANTITY.match(str(q)) if isinstance(q, (str, int, float)) and not isinstance(q, bool) else None
    if not m:
        return None
    sign, num, suffix = m.groups()
    v = Fraction(num)
    if suffix and suffix[0] in "eE" and len(suffix) > 1:
        v *= Fraction(10) ** int(suffix[1:])
    elif suffix:
        v *= QUANTITY_SUFFIX[suffix]
    return -v if sign == "-" else v


def _quantity(q):
    """A resource.Quantity as a float of its base unit (cores, bytes)."""
    v = parse_quantity(str(q).strip())
    if v is None:
        raise ValueError("not a quantity: %r" % (q,))
    return float(v)


def memory_limit(spec):
    """A container's resources.limits.memory in whole bytes (rounded up, as
    the kubelet's Value() does: "100m" is 1 byte, which the API admits with
    a warning; runc refuses to start under such a limit, here the first
    poll kills it), or None: no limit, 0 (no limit to the runtime either),
    or what the API server would have refused (not a quantity, negative)."""
    r = spec.get("resources")
    lim = r.get("limits") if isinstance(r, dict) else None
    v = parse_quantity(lim.get("memory")) if isinstance(lim, dict) else None
    if v is None or v <= 0:
        return None
    return math.ceil(v)


def group_memory(groups):
    """{pgid: bytes} for the process groups given: the anonymous resident
    memory (statm resident - shared) of every process in each, from /proc.
    What a container's memory cgroup cannot reclaim, roughly: the page
    cache it would reclaim before OOM-killing is left out, and so are
    shared memory (tmpfs, /dev/shm) and mapped files; copy-on-write pages
    shared after a fork count in every process that maps them."""
    page = os.sysconf("SC_PAGE_SIZE")
    used = dict.fromkeys(groups, 0)
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = _read_small("/proc/%s/stat" % d)
            # after the command's ")": state ppid pgrp ...
            pgrp = int(stat[stat.rfind(b")") + 2:].split()[2])
            if pgrp not in used:
                continue
            statm = _read_small("/proc/%s/statm" % d).split()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        used[pgrp] += max(0, int(statm[1]) - int(statm[2])) * page
    return used


def _read_small(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def read_tail(path, n):
    """At most the last n bytes of the file, decoded as the API's JSON
    would carry them ("" when it is missing), as tail.ReadAtMost."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            data = f.read(n)
    except (OSError, TypeError):
        return ""
    return data.decode("utf-8", "replace")


class ImageMap:
    """--image PATTERN=DIR[=ENTRYPOINT]: the first pattern (fnmatch on the
    reference as written and as normalized) that matches gives the
    directory put first on PATH and the image's ENTRYPOINT, if any."""

    def __init__(self, specs):
        self.rules = []
        for sp in specs or []:
            parts = sp.split("=", 2)
            if len(parts) < 2 or not parts[0] or not parts[1]:
                raise ValueError("--image wants PATTERN=DIR[=ENTRYPOINT], got %r" % sp)
            ep = parts[2].split() if len(parts) == 3 and parts[2].strip() else []
            self.rules.append((parts[0], os.path.abspath(parts[1]), ep))

    def resolve(self, image):
        norm = normalize_image(image)
        for pat, d, ep in self.rules + BUILTIN_IMAGES:
            if fnmatch.fnmatchcase(image, pat) or fnmatch.fnmatchcase(norm, pat):
                return d, ep
        return None


# Images every node "has", after the --image rules: the service mesh's
# proxy that the stand-in's injection adds (apistore.py), played by this
# file in --proxy mode: it runs until SIGTERM, then exits 0, as pilot-agent
# does after draining.
_HERE = os.path.dirname(os.path.abspath(__file__))
BUILTIN_IMAGES = [("docker.io/istio/proxyv2:*", _HERE, [sys.executable, os.path.abspath(__file__), "--proxy"])]


def proxy_main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


# ---- addresses -----------------------------------------------------------------------

class IPPool:
    """Pod addresses 127.R.x.y from one /16 of loopback. R is random per
    stand-in and reserved by binding 127.R.255.254:RESERVE_PORT for the
    stand-in's lifetime, so stand-ins running side by side never hand out
    the same address. Addresses go round-robin over the /16: one is reused
    only after ~65000 others."""

    RESERVE_PORT = 65431

    def __init__(self, second=None):
        self.sock = None
        tries = [second] if second is not None else random.sample(range(100, 255), 155)
        for r in tries:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.%d.255.254" % r, self.RESERVE_PORT))
            except OSError:
                s.close()
                if second is not None:
                    raise
                continue
            self.sock, self.r = s, r
            break
        if self.sock is None:
            raise RuntimeError("no free 127.R.0.0/16 range for pod addresses")
        self.next = 1
        self.used = set()

    def take(self):
        for _ in range(65536):
            n = self.next
            self.next = self.next % (256 * 256 - 2) + 1
            a, b = divmod(n, 256)
            if b in (0, 255) or (a, b) == (255, 254):
                continue
            ip = "127.%d.%d.%d" % (self.r, a, b)
            if ip not in self.used:
                self.used.add(ip)
                return ip
        raise RuntimeError("pod addresses exhausted")

    def give(self, ip):
        self.used.discard(ip)


# ---- the reaper: kills process groups after the stand-in dies ------------------------

def reaper_main():
    """Reads "+PGID" / "-PGID" lines on stdin; at EOF (the stand-in ended,
    however) SIGKILLs every group still listed."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    groups = set()
    for line in sys.stdin.buffer:
        line = line.strip()
        try:
            pg = int(line[1:])
        except ValueError:
            continue
        if line[:1] == b"+":
            groups.add(pg)
        elif line[:1] == b"-":
            groups.discard(pg)
    for pg in groups:
        try:
            os.killpg(pg, signal.SIGKILL)
        except OSError:
            pass


_LIBC = None


def _pdeathsig():
    """preexec_fn: the child gets SIGKILL when the kubelet thread that
    forked it ends (the stand-in dying), then gets its own session."""
    _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def catches_sigterm(pid):
    """Whether the process has a SIGTERM handler (SigCgt in /proc)."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except (OSError, ValueError):
        pass
    return False


# ---- runtime state -----------------------------------------------------------------

class Container:
    def __init__(self, spec):
        self.name = spec["name"]
        self.spec = spec
        self.image = spec.get("image", "")
        self.proc = None
        self.state = {"waiting": {"reason": "ContainerCreating"}}
        self.last = {}
        self.restarts = 0
        self.ran = False           # an instance was started (or failed to start) before
        self.done = False          # terminated for good: restartPolicy says no
        self.next_try = 0.0
        self.pull_backoff = 0.0
        self.flip_at = None        # when ErrImagePull shows as ImagePullBackOff
        self.pull_msg = ""
        self.crash_backoff = 0.0   # 0: the next restart is immediate
        self.cid = ""
        self.image_id = ""
        self.started_at = None
        self.log = None            # current instance's log file
        self.term_log = None       # current instance's termination-message file, if it has one
        self.prev_log = None
        self.term_sent = False
        self.stop_sent = False     # stopping it began (SIGTERM if it has a grace period)
        # a native sidecar (1.29+): an init container with restartPolicy
        # Always -- restarted whatever the pod's policy, stopped after the rest
        self.sidecar = spec.get("restartPolicy") == "Always"
        self.mem_limit = memory_limit(spec)  # bytes, or None: never measured
        self.oom_killed = False    # the current instance went over mem_limit and was killed

    def running(self):
        return self.proc is not None


class PodRT:
    def __init__(self, pod, root, ip, host_ip):
        m = pod["metadata"]
        self.uid, self.ns, self.name = m["uid"], m["namespace"], m["name"]
        self.node, self.host_ip = pod["spec"]["nodeName"], host_ip
        self.dir = os.path.join(root, "pods", "%s_%s_%s" % (self.ns, self.name, self.uid))
        os.makedirs(self.dir, exist_ok=True)
        self.ip = ip
        self.sa_dir = None
        self.start_time = now_rfc3339()
        spec = pod.get("spec") or {}
        self.sidecars = {c["name"]: Container(c) for c in spec.get("initContainers") or []
                         if isinstance(c, dict) and c.get("restartPolicy") == "Always"}
        self.initialized = not self.sidecars  # every sidecar started once: the others may start
        self.containers = {}
        for c in spec.get("containers") or []:
            self.containers[c["name"]] = Container(c)
            if self.sidecars:
                self.containers[c["name"]].state = {"waiting": {"reason": "PodInitializing"}}
        self.kill_at = None        # monotonic time of the SIGKILL when stopping
        self.grace = None          # the grace period it is stopping with
        self.ip_owned = True
        self.evicted = None        # (reason, message, grace) once the kubelet stops it itself:
                                   # an eviction (Evicted) or the node's shutdown (Terminated)
        self.finished = False      # its terminal status is written
        self.conds = {}            # type -> (status, reason, message, lastTransitionTime)

    def every(self):
        """Sidecars first: the order they start in."""
        return list(self.sidecars.values()) + list(self.containers.values())

    def any_running(self):
        return any(c.running() for c in self.every())

    def main_running(self):
        return any(c.running() for c in self.containers.values())


class LogSource:
    def __init__(self, path, alive):
        self.path, self.alive = path, alive


# ---- the node ----------------------------------------------------------------------

class Kubelet(LocalNode):
    def __init__(self, store, app, args, log):
        super().__init__(store)
        global _LIBC
        _LIBC = ctypes.CDLL(None, use_errno=True)
        self.app, self.log = app, log
        self.root = args.dir
        self.images = ImageMap(args.image)
        self.cluster = app.cluster
        self.scheduler = Scheduler(store, self.event,
                                   [k for k in (args.pod_topology_labels or "").split(",") if k])
        self.backoff = args.backoff
        self.backoff_max = args.backoff_max
        self.config_retry = min(2.0, args.backoff)
        self.shutting_down = {}    # node name -> monotonic deadline of its graceful shutdown
        second = None
        if args.pod_cidr:
            m = re.match(r"^127\.(\d+)\.0\.0/16$", args.pod_cidr)
            if not m or not 1 <= int(m.group(1)) <= 254:
                raise ValueError("--pod-cidr must be 127.R.0.0/16")
            second = int(m.group(1))
        self.ips = IPPool(second)
        self.base_env = {k: v for k, v in os.environ.items()
                         if k.startswith("RL_") or k in SANITIZER_ENV or k in (args.pass_env or [])}
        self.pods = {}             # uid -> PodRT
        self.memory_due = 0.0      # monotonic time of the next memory poll
        self.events = {}           # (pod uid, reason, message, container) -> Event name
        self.mu = threading.Lock()  # guards self.pods; never taken while holding the store lock
        self.wake = threading.Event()
        self.stopping = False
        self.reaper = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--reaper"],
                                       stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
        store.listeners.append(self._on_event)

    # -- the registry side (called with the store lock held) --------------------------
    def on_pod_create(self, pod):
        pass  # the scheduler binds it in a separate write

    def graceful_delete(self, t, cur, grace):
        node = (cur.get("spec") or {}).get("nodeName")
        if node and ("", node) not in self.store.objs[NODES]:
            return super().graceful_delete(t, cur, grace)  # no kubelet: the grace timer
        st = self.store
        m = cur["metadata"]
        grace = self.effective_grace(cur, grace)
        if m.get("deletionTimestamp") and m.get("deletionGracePeriodSeconds") is not None \
                and grace >= int(m["deletionGracePeriodSeconds"]):
            return copy.deepcopy(cur), False
        if grace == 0 and not m.get("finalizers"):
            self.wake.set()
            return st.remove(t, cur), True
        new = copy.deepcopy(cur)
        nm = new["metadata"]
        nm["deletionTimestamp"] = now_rfc3339(time.time() + grace)
        nm["deletionGracePeriodSeconds"] = grace
        st._commit(t, "MODIFIED", new, cur)
        self.wake.set()
        return copy.deepcopy(new), False

    def _on_event(self, ev):
        if ev.key in (PODS, NODES, ("", "secrets"), ("", "configmaps"), ("", "serviceaccounts")):
            self.wake.set()

    # -- the loop ----------------------------------------------------------------------
    def run(self):
        # Every child is forked from this thread: PR_SET_PDEATHSIG fires when
        # the forking thread ends, and this one lives as long as the process.
        while not self.stopping:
            self.wake.wait(self._nap())
            self.wake.clear()
            if self.stopping:
                break
            try:
                self.schedule()
                with self.mu:
                    self.step()
            except Exception as e:  # keep the node alive, like a real kubelet
                import traceback
                self.log({"msg": "kubelet error", "error": repr(e),
                          "trace": traceback.format_exc()[-2000:]})

    def _nap(self):
        """Until the next thing to do: exits are polled every 50 ms while a
        process runs, timers (back-offs, grace periods) wake it on time."""
        now, nap = time.monotonic(), 1.0
        for rt in list(self.pods.values()):
            if rt.finished:
                continue
            if rt.kill_at is not None:
                nap = min(nap, rt.kill_at - now)
            for c in rt.every():
                if c.proc is not None:
                    nap = min(nap, 0.05)
                elif not c.done:
                    nap = min(nap, c.next_try - now)
                    if c.flip_at is not None:
                        nap = min(nap, c.flip_at - now)
        return max(0.005, nap)

    def shutdown(self):
        """Stand-in exit: every container's group is killed, at once."""
        self.stopping = True
        self.wake.set()
        for rt in list(self.pods.values()):
            for c in rt.every():
                if c.proc is not None:
                    try:
                        os.killpg(c.proc.pid, signal.SIGKILL)
                    except OSError:
                        pass
        for rt in list(self.pods.values()):
            for c in rt.every():
                if c.proc is not None:
                    try:
                        c.proc.wait(timeout=2)
                    except (subprocess.TimeoutExpired, OSError):
                        pass
        try:
            self.reaper.stdin.close()
        except OSError:
            pass

    def _reaper_note(self, op, pgid):
        try:
            self.reaper.stdin.write(b"%s%d\n" % (op, pgid))
            self.reaper.stdin.flush()
        except (OSError, ValueError):
            pass

    # -- scheduler (scheduler.py) ---------------------------------------------------------
    def schedule(self):
        self.scheduler.schedule()

    # -- events -------------------------------------------------------------------------
    def event(self, pod, reason, message, typ="Normal", component="kubelet", container=None):
        """A core/v1 Event about the pod, as the kubelet's and scheduler's
        recorders write them: a repeat (same object, reason, message)
        raises count and lastTimestamp of the one Event."""
        st = self.store
        t = st.types[("", "v1", "events")]
        m = pod["metadata"]
        ref = {"kind": "Pod", "namespace": m["namespace"], "name": m["name"], "uid": m["uid"],
               "apiVersion": "v1", "resourceVersion": m.get("resourceVersion", "")}
        if container:
            ref["fieldPath"] = "spec.containers{%s}" % container
        key = (m["uid"], reason, message, container)
        now = now_rfc3339()
        rt = self.pods.get(m["uid"])
        host = (pod.get("spec") or {}).get("nodeName") or (rt.node if rt else NODE_NAME)
        with st.lock:
            name = self.events.get(key)
            cur = st.objs[("", "events")].get((m["namespace"], name)) if name else None
            if cur is not None:
                new = copy.deepcopy(cur)
                new["count"] = int(cur.get("count") or 1) + 1
                new["lastTimestamp"] = now
                st._finish_update(t, cur, new, False)
                return
            name = "%s.%x" % (m["name"], time.time_ns())
            try:
                st.create(t, m["namespace"], {
                    "metadata": {"name": name, "namespace": m["namespace"]},
                    "involvedObject": ref, "reason": reason, "message": message,
                    "source": {"component": component} if component != "kubelet"
                    else {"component": "kubelet", "host": host},
                    "firstTimestamp": now, "lastTimestamp": now, "count": 1, "type": typ,
                    "eventTime": None, "reportingComponent": component,
                    "reportingInstance": host if component == "kubelet" else ""})
            except APIError:
                return  # the namespace is going away
            self.events[key] = name

    def set_max_pods(self, n):
        """Admin POST /node: the first node's pod capacity (None: 110)."""
        self.cluster.set_max_pods(NODE_NAME, n)
        self.wake.set()

    def shutdown_node(self, node, notice):
        """Graceful node shutdown: the node's pods get SIGTERM now and at
        most `notice` seconds before SIGKILL; none is admitted any more."""
        with self.mu:  # a second notice does not extend the first
            deadline = time.monotonic() + notice
            self.shutting_down[node] = min(deadline, self.shutting_down.get(node, deadline))
        self.wake.set()

    # -- the kubelet: one pass over this node's pods ---------------------------------------
    def step(self):
        st = self.store
        with st.lock:
            nodes = {n for _, n in st.objs[NODES]}
            mine = [copy.deepcopy(p) for p in st.objs[PODS].values()
                    if (p.get("spec") or {}).get("nodeName") in nodes]
        present = {p["metadata"]["uid"] for p in mine}
        for uid, rt in list(self.pods.items()):
            if uid not in present:
                self._forget(rt)  # deleted at once (grace 0), or its node is gone: kill what runs
        self.shutting_down = {n: d for n, d in self.shutting_down.items() if n in nodes}
        self._enforce_memory()
        for pod in mine:
            self.sync(pod)

    def _enforce_memory(self):
        """The memory cgroup's OOM killer: every MEMORY_POLL seconds the
        memory of each running container with limits.memory (group_memory);
        one over it is SIGKILLed whole, as with memory.oom.group, and ends
        OOMKilled (_reap). Nothing is read while no such container runs."""
        now = time.monotonic()
        if now < self.memory_due:
            return
        self.memory_due = now + MEMORY_POLL
        watched = {c.proc.pid: (rt, c) for rt in self.pods.values() for c in rt.every()
                   if c.proc is not None and c.mem_limit and not c.oom_killed}
        if not watched:
            return
        for pgid, used in group_memory(watched).items():
            rt, c = watched[pgid]
            if used > c.mem_limit:
                c.oom_killed = True
                self._kill_group(c, signal.SIGKILL)
                self.log({"msg": "kubelet: container OOM-killed", "pod": "%s/%s" % (rt.ns, rt.name),
                          "container": c.name, "memory": used, "limit": c.mem_limit})

    def _forget(self, rt):
        for c in rt.every():
            if c.proc is not None:
                self._kill_group(c, signal.SIGKILL)
                try:
                    c.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
                self._reaper_note(b"-", c.proc.pid)
                c.proc = None
        if rt.ip and rt.ip_owned:
            self.ips.give(rt.ip)
        self.pods.pop(rt.uid, None)
        self.events = {k: v for k, v in self.events.items() if k[0] != rt.uid}
        self.log({"msg": "kubelet: pod gone", "pod": "%s/%s" % (rt.ns, rt.name)})

    def _kill_group(self, c, sig):
        try:
            os.killpg(c.proc.pid, sig)
        except OSError:
            pass

    def sync(self, pod):
        m = pod["metadata"]
        uid = m["uid"]
        phase = (pod.get("status") or {}).get("phase")
        rt = self.pods.get(uid)
        if rt is None:
            if phase in ("Succeeded", "Failed") or m.get("deletionTimestamp"):
                if m.get("deletionTimestamp"):
                    self._final_delete(pod)  # deleted before it ever started here
                return
            if pod["spec"]["nodeName"] in self.shutting_down:
                return self._reject(pod, "NodeShutdown", "Pod was rejected as the node is shutting down.")
            host_net = bool((pod.get("spec") or {}).get("hostNetwork"))
            host_ip = self.cluster.host_ip(pod["spec"]["nodeName"])
            rt = PodRT(pod, self.root, host_ip if host_net else self.ips.take(), host_ip)
            rt.ip_owned = not host_net
            self.pods[uid] = rt
            self._mount_sa(pod, rt)
            self.log({"msg": "kubelet: pod admitted", "pod": "%s/%s" % (rt.ns, rt.name), "ip": rt.ip})
        if rt.finished:
            if m.get("deletionTimestamp"):
                self._final_delete(pod)
            return
        now = time.monotonic()
        if rt.node in self.shutting_down and rt.evicted is None:
            left = max(0, int(self.shutting_down[rt.node] - now))
            grace = min(left, int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)))
            rt.evicted = (SHUTDOWN_REASON, SHUTDOWN_MESSAGE, grace)
        stopping = rt.evicted is not None or bool(m.get("deletionTimestamp"))
        for c in rt.every():
            self._reap(rt, c, pod, stopping)
        if stopping:
            grace = rt.evicted[2] if rt.evicted is not None else int(m.get("deletionGracePeriodSeconds") or 0)
            if rt.kill_at is not None and grace < rt.grace:
                rt.kill_at, rt.grace = min(rt.kill_at, now + grace), grace  # a later, shorter delete
            if rt.kill_at is None:
                rt.kill_at, rt.grace = now + grace, grace
                if rt.evicted is not None and rt.evicted[0] == "Evicted":
                    self.event(pod, "Evicted", rt.evicted[1], "Warning")
                for c in rt.every():
                    c.done = True
            self._stop_in_order(rt, pod, now)
            if rt.any_running():
                self._write_status(pod, rt)
                return
            rt.finished = True
            self._write_status(pod, rt, terminal=True)
            self._teardown(rt)
            if rt.evicted is None:
                self._final_delete(pod)
            return
        for c in rt.sidecars.values():
            self._advance(rt, c, pod, now)
        rt.initialized = rt.initialized or all(c.running() for c in rt.sidecars.values())
        if rt.initialized:
            for c in rt.containers.values():
                self._advance(rt, c, pod, now)
        if rt.sidecars and all(c.done for c in rt.containers.values()) and not rt.main_running():
            # the pod's work is over: its sidecars are stopped, as at a delete
            if rt.kill_at is None:
                rt.grace = int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
                rt.kill_at = now + rt.grace
                for c in rt.sidecars.values():
                    c.done = True
            self._stop_in_order(rt, pod, now)
        terminal = all(c.done for c in rt.every()) and not rt.any_running()
        if terminal:
            rt.finished = True
            self._teardown(rt)
        self._write_status(pod, rt, terminal=terminal)

    def _stop_in_order(self, rt, pod, now):
        """A stopping pod's containers get SIGTERM, its sidecars only once
        the others are gone (1.29+); SIGKILL for all at rt.kill_at."""
        for c in rt.every() if not rt.main_running() else rt.containers.values():
            if c.proc is not None and not c.stop_sent:
                self._stop(rt, pod, c, rt.grace)
        if now >= rt.kill_at:
            for c in rt.every():
                if c.proc is not None:
                    self._kill_group(c, signal.SIGKILL)

    def _stop(self, rt, pod, c, grace):
        c.stop_sent = True
        if grace > 0:
            # A container's main process is its PID 1: a signal it has no
            # handler for is not delivered at all.
            if catches_sigterm(c.proc.pid):
                try:
                    os.kill(c.proc.pid, signal.SIGTERM)
                except OSError:
                    pass
            c.term_sent = True
            self.log({"msg": "kubelet: SIGTERM", "pod": "%s/%s" % (rt.ns, rt.name),
                      "container": c.name, "grace": grace})
        self.event(pod, "Killing", "Stopping container %s" % c.name, container=c.name)

    def _teardown(self, rt):
        """The sandbox goes once the pod is terminal; its address stays in the
        status but is free for later pods (round-robin keeps it unused for long)."""
        if rt.ip and rt.ip_owned:
            self.ips.give(rt.ip)
            rt.ip_owned = False  # given back once

    def _reject(self, pod, reason, message):
        """Admission refused (the node is shutting down): Failed at once,
        no container started, as the kubelet's admit handlers do."""
        st = self.store
        t = st.types[("", "v1", "pods")]
        m = pod["metadata"]
        with st.lock:
            cur = st.objs[PODS].get((m["namespace"], m["name"]))
            if cur is None or cur["metadata"]["uid"] != m["uid"]:
                return
            new = copy.deepcopy(cur)
            new.setdefault("status", {}).update(phase="Failed", reason=reason, message=message)
            st._finish_update(t, cur, new, False)
        self.log({"msg": "kubelet: pod rejected", "pod": "%s/%s" % (m["namespace"], m["name"]), "reason": reason})

    def _final_delete(self, pod):
        m = pod["metadata"]
        st = self.store
        t = st.types[("", "v1", "pods")]
        with st.lock:
            cur = st.objs[PODS].get((m["namespace"], m["name"]))
            if cur is None or cur["metadata"]["uid"] != m["uid"]:
                return
            if cur["metadata"].get("finalizers"):
                if cur["metadata"].get("deletionGracePeriodSeconds") != 0:
                    new = copy.deepcopy(cur)
                    new["metadata"]["deletionGracePeriodSeconds"] = 0
                    st._commit(t, "MODIFIED", new, cur)
            else:
                st.remove(t, cur)
        rt = self.pods.pop(m["uid"], None)
        self.events = {k: v for k, v in self.events.items() if k[0] != m["uid"]}
        if rt is not None:
            self.log({"msg": "kubelet: pod deleted", "pod": "%s/%s" % (rt.ns, rt.name)})

    # -- service account "mount" ----------------------------------------------------------
    def _mount_sa(self, pod, rt):
        spec = pod.get("spec") or {}
        if not any(m.get("mountPath") == "/var/run/secrets/kubernetes.io/serviceaccount"
                   for c in spec.get("containers") or [] for m in c.get("volumeMounts") or []
                   if isinstance(m, dict)):
            return  # automountServiceAccountToken: false
        d = os.path.join(rt.dir, "serviceaccount")
        os.makedirs(d, exist_ok=True)
        try:
            tok = self.app.mint_sa_token(rt.ns, spec.get("serviceAccountName") or "default",
                                         pod=(rt.ns, rt.name, rt.uid))
        except APIError:
            return
        for name, text in (("token", tok), ("namespace", rt.ns)):
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        shutil.copyfile(os.path.join(self.root, "ca.crt"), os.path.join(d, "ca.crt"))
        rt.sa_dir = d

    # -- containers ----------------------------------------------------------------------
    def _reap(self, rt, c, pod, stopping):
        if c.proc is None:
            return
        try:  # exited? (not reaped yet, so its group id cannot be reused meanwhile)
            info = os.waitid(os.P_PID, c.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = True
        if info is None:
            return
        # The main process is gone: the rest of its PID namespace goes too.
        self._kill_group(c, signal.SIGKILL)
        rc = c.proc.wait()
        self._reaper_note(b"-", c.proc.pid)
        c.proc = None
        code = rc if rc >= 0 else 128 - rc
        # OOMKilled when the OOM killer's SIGKILL ended it (exit status 137);
        # a main process that had exited by itself keeps its own status
        oom = c.oom_killed and rc == -signal.SIGKILL
        reason = "OOMKilled" if oom else "Completed" if code == 0 else "Error"
        self._terminated(c, code, reason, self._termination_message(c, code))
        self.log({"msg": "kubelet: container exited", "pod": "%s/%s" % (rt.ns, rt.name),
                  "container": c.name, "exitCode": code, "reason": reason})
        policy = "Always" if c.sidecar else (pod.get("spec") or {}).get("restartPolicy", "Always")
        if c.done or stopping or policy == "Never" or (policy == "OnFailure" and code == 0):
            c.done = True
        else:
            self._plan_restart(rt, c)

    def _termination_message(self, c, code):
        """The terminated state's message (kuberuntime's getTerminationMessage):
        the termination-message file's last 4096 bytes, whatever the exit
        status; the log's tail instead when the file is empty (or there is
        none), the policy FallbackToLogsOnError and the status not 0."""
        msg = read_tail(c.term_log, MAX_TERMINATION_MESSAGE) if c.term_log else ""
        if not msg and code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            return self._log_tail(c.log)
        return msg or None

    @staticmethod
    def _termination_log(rt, c):
        """The file the kubelet bind-mounts at terminationMessagePath: fresh
        and empty for every instance of the container, mode 0666 whatever
        the umask. The stand-in cannot mount it, so only a container that
        keeps the default path gets one (its host path in
        $RINGLEADER_TERMINATION_LOG); None for another path."""
        if c.spec.get("terminationMessagePath") not in (None, "", TERMINATION_MESSAGE_PATH):
            return None
        path = os.path.join(rt.dir, "termination-log-%s-%d" % (c.name, c.restarts))
        with open(path, "wb"):
            pass
        os.chmod(path, 0o666)
        return path

    @staticmethod
    def _log_tail(path):
        """terminationMessagePolicy FallbackToLogsOnError: the last 80 lines
        of the log, at most its last 2048 bytes, as the kubelet reads them."""
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                n = f.tell()
                f.seek(max(0, n - 2048))
                data = f.read()
        except (OSError, TypeError):
            return None
        lines = data.splitlines(keepends=True)[-80:]
        return b"".join(lines).decode("utf-8", "replace") or None

    def _terminated(self, c, code, reason, message=None):
        term = {"exitCode": code, "reason": reason, "startedAt": c.started_at,
                "finishedAt": now_rfc3339()}
        if message:
            term["message"] = message
        if c.cid:
            term["containerID"] = c.cid
        c.state = {"terminated": term}
        c.ran = True

    def _plan_restart(self, rt, c):
        now = time.monotonic()
        if c.crash_backoff == 0:
            c.next_try = now
            return
        c.next_try = now + c.crash_backoff
        c.last = c.state
        self.event(self._pod_of(rt), "BackOff", "Back-off restarting failed container %s in pod %s_%s(%s)"
                   % (c.name, rt.name, rt.ns, rt.uid), "Warning", container=c.name)
        c.state = {"waiting": {"reason": "CrashLoopBackOff",
                               "message": "back-off %s restarting failed container=%s pod=%s_%s(%s)"
                               % (go_duration(c.crash_backoff), c.name, rt.name, rt.ns, rt.uid)}}

    def _advance(self, rt, c, pod, now):
        if c.proc is not None or c.done:
            return
        if now < c.next_try:
            if c.flip_at is not None and now >= c.flip_at:
                c.flip_at = None
                c.state = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image '
                                       '"%s": ErrImagePull: %s' % (c.image, c.pull_msg)}}
                self.event(pod, "BackOff", 'Back-off pulling image "%s"' % c.image, container=c.name)
                self.event(pod, "Failed", "Error: ImagePullBackOff", "Warning", container=c.name)
            return
        # 1. the image
        res = self.images.resolve(c.image)
        if res is None:
            c.pull_backoff = self.backoff if c.pull_backoff == 0 else min(2 * c.pull_backoff,
                                                                           self.backoff_max)
            c.next_try = now + c.pull_backoff
            c.flip_at = now + min(1.0, c.pull_backoff / 2)
            ref = normalize_image(c.image)
            c.pull_msg = ('rpc error: code = NotFound desc = failed to pull and unpack image "%s": '
                          'failed to resolve reference "%s": %s: not found' % (ref, ref, ref))
            c.state = {"waiting": {"reason": "ErrImagePull", "message": c.pull_msg}}
            self.event(pod, "Pulling", 'Pulling image "%s"' % c.image, container=c.name)
            self.event(pod, "Failed", 'Failed to pull image "%s": %s' % (c.image, c.pull_msg), "Warning",
                       container=c.name)
            self.event(pod, "Failed", "Error: ErrImagePull", "Warning", container=c.name)
            return
        c.pull_backoff = 0
        c.flip_at = None
        bindir, entrypoint = res
        # 2. the environment
        env, err = self._env(pod, rt, c, bindir)
        if err:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": err}}
            self.event(pod, "Failed", "Error: " + err, "Warning", container=c.name)
            c.next_try = now + self.config_retry
            return
        # 3. the command
        lookup = env.get
        cmd = [expand(x, lookup) for x in c.spec.get("command") or []]
        args = [expand(x, lookup) for x in c.spec.get("args") or []]
        argv = (cmd + args) if cmd else (entrypoint + args)
        if not argv:
            c.state = {"waiting": {"reason": "CreateContainerError", "message": "no command specified"}}
            c.next_try = now + self.config_retry
            return
        if not c.ran:
            self.event(pod, "Pulled", 'Container image "%s" already present on machine' % c.image,
                       container=c.name)
        restarting = c.ran
        if restarting:
            c.last = c.state if "terminated" in c.state else c.last
            c.restarts += 1
            c.crash_backoff = self.backoff if c.crash_backoff == 0 else min(2 * c.crash_backoff,
                                                                             self.backoff_max)
        c.cid = "containerd://" + secrets.token_hex(32)
        c.image_id = normalize_image(c.image).rsplit(":", 1)[0] + "@sha256:" + \
            hashlib.sha256(bindir.encode()).hexdigest()
        c.started_at = now_rfc3339()
        logdir = os.path.join(rt.dir, "logs", c.name)
        os.makedirs(logdir, exist_ok=True)
        c.prev_log, c.log = c.log, os.path.join(logdir, "%d.log" % c.restarts)
        c.term_log = None
        exe = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH", ""))
        if not exe or not os.access(exe, os.X_OK) or os.path.isdir(exe):
            open(c.log, "ab").close()
            why = ("exec: \"%s\": executable file not found in $PATH" % argv[0]) if "/" not in argv[0] \
                else ("exec: \"%s\": stat %s: no such file or directory" % (argv[0], argv[0]))
            self._terminated(c, 128, "StartError",
                             "failed to create containerd task: failed to create shim task: OCI "
                             "runtime create failed: runc create failed: unable to start container "
                             "process: %s: unknown" % why)
            self.event(pod, "Created", "Created container %s" % c.name, container=c.name)
            self.event(pod, "Failed", "Error: " + c.state["terminated"]["message"], "Warning",
                       container=c.name)
            self._after_start_failure(rt, c, pod)
            return
        cwd = c.spec.get("workingDir") or os.path.join(rt.dir, "root")
        try:
            os.makedirs(cwd, exist_ok=True)
            c.term_log = self._termination_log(rt, c)
            if c.term_log:
                env[TERMINATION_LOG_ENV] = c.term_log
            with open(c.log, "ab") as logf:
                c.proc = subprocess.Popen(argv, executable=exe, env=env, cwd=cwd,
                                          stdin=subprocess.DEVNULL, stdout=logf,
                                          stderr=subprocess.STDOUT, close_fds=True,
                                          start_new_session=True, preexec_fn=_pdeathsig)
        except OSError as e:
            self._terminated(c, 128, "StartError", "failed to create containerd task: %s" % e)
            self._after_start_failure(rt, c, pod)
            return
        self._reaper_note(b"+", c.proc.pid)
        c.term_sent = False
        c.oom_killed = False
        c.state = {"running": {"startedAt": c.started_at}}
        self.event(pod, "Created", "Created container %s" % c.name, container=c.name)
        self.event(pod, "Started", "Started container %s" % c.name, container=c.name)
        self.log({"msg": "kubelet: container started", "pod": "%s/%s" % (rt.ns, rt.name),
                  "container": c.name, "pid": c.proc.pid, "command": argv[0]})  # args may hold secrets

    def _pod_of(self, rt):
        return {"metadata": {"namespace": rt.ns, "name": rt.name, "uid": rt.uid}}

    def _after_start_failure(self, rt, c, pod):
        policy = "Always" if c.sidecar else (pod.get("spec") or {}).get("restartPolicy", "Always")
        if policy == "Never":
            c.done = True
        else:
            self._plan_restart(rt, c)

    # -- the environment ------------------------------------------------------------------
    def _env(self, pod, rt, c, bindir):
        """(env, None) or (None, the CreateContainerConfigError message)."""
        st = self.store
        m, spec = pod["metadata"], pod.get("spec") or {}
        ns = m["namespace"]
        port, api = str(self.app.port), self.app.args.host
        svc = {"KUBERNETES_SERVICE_HOST": api, "KUBERNETES_SERVICE_PORT": port,
               "KUBERNETES_SERVICE_PORT_HTTPS": port,
               "KUBERNETES_PORT": "tcp://%s:%s" % (api, port),
               "KUBERNETES_PORT_%s_TCP" % port: "tcp://%s:%s" % (api, port),
               "KUBERNETES_PORT_%s_TCP_PROTO" % port: "tcp",
               "KUBERNETES_PORT_%s_TCP_PORT" % port: port,
               "KUBERNETES_PORT_%s_TCP_ADDR" % port: api}
        tmp = {}

        def lookup(name):
            return tmp[name] if name in tmp else svc.get(name)

        def obj(kind, name):
            key = ("", "secrets") if kind == "Secret" else ("", "configmaps")
            with st.lock:
                o = st.objs[key].get((ns, name))
                return copy.deepcopy(o) if o is not None else None

        def value_of(kind, o, key):
            if kind == "Secret":
                v = (o.get("data") or {}).get(key)
                return None if v is None else base64.b64decode(v).decode("utf-8", "surrogateescape")
            v = (o.get("data") or {}).get(key)
            if v is None and key in (o.get("binaryData") or {}):
                v = base64.b64decode(o["binaryData"][key]).decode("utf-8", "surrogateescape")
            return v

        for ef in c.spec.get("envFrom") or []:
            for kind, ref in (("ConfigMap", ef.get("configMapRef")), ("Secret", ef.get("secretRef"))):
                if not isinstance(ref, dict):
                    continue
                o = obj(kind, ref.get("name"))
                if o is None:
                    if ref.get("optional"):
                        continue
                    return None, '%s "%s" not found' % (kind.lower(), ref.get("name"))
                keys = list((o.get("data") or {}).keys())
                if kind == "ConfigMap":
                    keys += list((o.get("binaryData") or {}).keys())
                for k in keys:
                    name = (ef.get("prefix") or "") + k
                    if ENV_NAME.match(name):
                        tmp[name] = value_of(kind, o, k)
        for e in c.spec.get("env") or []:
            if not isinstance(e, dict) or not e.get("name"):
                continue
            name = e["name"]
            vf = e.get("valueFrom")
            if not isinstance(vf, dict):
                tmp[name] = expand(str(e.get("value") or ""), lookup)
                continue
            if isinstance(vf.get("fieldRef"), dict):
                v = self._field(pod, rt, vf["fieldRef"].get("fieldPath", ""))
                if v is None:
                    return None, 'unsupported fieldPath: %s' % vf["fieldRef"].get("fieldPath")
                tmp[name] = v
            elif isinstance(vf.get("resourceFieldRef"), dict):
                tmp[name] = self._resource(c, vf["resourceFieldRef"])
            else:
                for kind, ref in (("Secret", vf.get("secretKeyRef")), ("ConfigMap", vf.get("configMapKeyRef"))):
                    if not isinstance(ref, dict):
                        continue
                    o = obj(kind, ref.get("name"))
                    if o is None:
                        if ref.get("optional"):
                            break
                        return None, '%s "%s" not found' % (kind.lower(), ref.get("name"))
                    v = value_of(kind, o, ref.get("key"))
                    if v is None:
                        if ref.get("optional"):
                            break
                        return None, "couldn't find key %s in %s %s/%s" % (ref.get("key"), kind, ns,
                                                                            ref.get("name"))
                    tmp[name] = v
                    break
        # What the image and the runtime give: PATH (the image's bin dir
        # first), HOSTNAME, HOME; the stand-in's RL_* and sanitizer settings.
        host = spec.get("hostname") or m["name"][:63]
        env = {"PATH": bindir + ":" + DEFAULT_PATH, "HOSTNAME": host, "HOME": os.path.join(rt.dir, "root")}
        env.update(self.base_env)
        if rt.sa_dir:
            env["RL_K8S_SA_DIR"] = rt.sa_dir
        env.update(svc)
        env.update(tmp)
        return env, None

    def _field(self, pod, rt, path):
        m = pod["metadata"]
        simple = {"metadata.name": m["name"], "metadata.namespace": m["namespace"],
                  "metadata.uid": m["uid"], "spec.nodeName": rt.node,
                  "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName", ""),
                  "status.podIP": rt.ip, "status.podIPs": rt.ip, "status.hostIP": rt.host_ip,
                  "status.hostIPs": rt.host_ip}
        if path in simple:
            return simple[path]
        mm = re.match(r"^metadata\.(labels|annotations)\['([^']+)'\]$", path)
        if mm:
            return (m.get(mm.group(1)) or {}).get(mm.group(2), "")
        if path in ("metadata.labels", "metadata.annotations"):
            d = m.get(path.split(".")[1]) or {}
            return "\n".join('%s="%s"' % (k, d[k]) for k in sorted(d))
        return None

    def _resource(self, c, ref):
        res = ref.get("resource", "")
        kind, _, what = res.partition(".")
        r = (c.spec.get("resources") or {})
        v = (r.get(kind) or {}).get(what)
        if v is None and kind == "requests":
            v = (r.get("limits") or {}).get(what)
        if v is None:  # no limit: the node's allocatable
            if what == "cpu":
                v = str(os.cpu_count() or 1)
            elif what == "memory":
                v = str(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
            else:
                v = "0"
        div = _quantity(ref.get("divisor") or "1")
        q = _quantity(v) / (div or 1)
        return str(int(-(-q // 1)))  # rounded up, as the kubelet does

    # -- status -----------------------------------------------------------------------------
    def _cond(self, rt, typ, status, reason=None, message=None):
        old = rt.conds.get(typ)
        t = old[3] if old and old[0] == status else now_rfc3339()
        rt.conds[typ] = (status, reason, message, t)
        c = {"type": typ, "status": status, "lastProbeTime": None, "lastTransitionTime": t}
        if reason:
            c["reason"] = reason
        if message:
            c["message"] = message
        return c

    def _status(self, pod, rt, terminal):
        cs = list(rt.containers.values())
        # The kubelet's getPhase: a waiting container that ran before counts
        # as stopped, one that never ran as waiting.
        running = sum(1 for c in cs if c.running())
        stopped = sum(1 for c in cs if "terminated" in c.state or ("waiting" in c.state and c.last))
        waiting = sum(1 for c in cs if "waiting" in c.state and not c.last)
        succeeded = sum(1 for c in cs if c.state.get("terminated", {}).get("exitCode") == 0)
        policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
        if rt.evicted is not None:
            phase = "Failed"  # the eviction's status function, written before the kill
        elif terminal:
            phase = "Succeeded" if all(c.state.get("terminated", {}).get("exitCode") == 0 for c in cs) \
                else "Failed"
        elif waiting:
            phase = "Pending"
        elif running:
            phase = "Running"
        elif stopped:
            if policy == "Always":
                phase = "Running"
            elif stopped == succeeded:
                phase = "Succeeded"
            elif policy == "Never":
                phase = "Failed"
            else:
                phase = "Running"
        else:
            phase = "Pending"
        spec = pod.get("spec") or {}
        per = MAX_POD_TERMINATION_MESSAGES // max(1, len(spec.get("containers") or [])
                                                  + len(spec.get("initContainers") or []))
        statuses = [self._container_status(c, terminal, per) for c in cs]
        statuses.sort(key=lambda x: x["name"])  # as the kubelet's status manager orders them
        unready = [c.name for c in rt.every() if not (c.running() and not terminal)]
        conds = []
        if terminal:
            conds.append(self._cond(rt, "PodReadyToStartContainers", "False"))
            conds.append(self._cond(rt, "Initialized", "True", "PodCompleted"))
            conds.append(self._cond(rt, "Ready", "False", "PodCompleted"))
            conds.append(self._cond(rt, "ContainersReady", "False", "PodCompleted"))
        else:
            conds.append(self._cond(rt, "PodReadyToStartContainers", "True"))
            if rt.initialized:
                conds.append(self._cond(rt, "Initialized", "True"))
            else:
                conds.append(self._cond(rt, "Initialized", "False", "ContainersNotInitialized",
                                        "containers with incomplete status: [%s]" % " ".join(
                                            c.name for c in rt.sidecars.values() if not c.running())))
            if unready:
                msg = "containers with unready status: [%s]" % " ".join(unready)
                conds.append(self._cond(rt, "Ready", "False", "ContainersNotReady", msg))
                conds.append(self._cond(rt, "ContainersReady", "False", "ContainersNotReady", msg))
            else:
                conds.append(self._cond(rt, "Ready", "True"))
                conds.append(self._cond(rt, "ContainersReady", "True"))
        if rt.evicted is not None:
            conds.append(self._cond(rt, "DisruptionTarget", "True", "TerminationByKubelet", rt.evicted[1]))
        status = {"phase": phase, "conditions": conds, "hostIP": rt.host_ip, "hostIPs": [{"ip": rt.host_ip}],
                  "podIP": rt.ip, "podIPs": [{"ip": rt.ip}], "startTime": rt.start_time,
                  "containerStatuses": statuses}
        if rt.sidecars:  # in the spec's order, not sorted
            status["initContainerStatuses"] = [self._container_status(c, terminal, per)
                                               for c in rt.sidecars.values()]
        if rt.evicted is not None:
            status["reason"], status["message"] = rt.evicted[0], rt.evicted[1]
        return status

    @staticmethod
    def _container_status(c, terminal, per):
        """One containerStatuses entry; terminated messages cut to `per`
        bytes, as the status manager's normalizeStatus does."""
        state, last = copy.deepcopy(c.state), copy.deepcopy(c.last)
        for term in (state.get("terminated"), last.get("terminated")):
            if term and len(term.get("message", "").encode()) > per:
                term["message"] = term["message"].encode()[:per].decode("utf-8", "replace")
        st = {"name": c.name, "state": state, "lastState": last,
              "ready": c.running() and not terminal, "restartCount": c.restarts,
              "image": normalize_image(c.image) if c.image_id else c.image,
              "imageID": c.image_id, "started": c.running()}
        if c.cid:
            st["containerID"] = c.cid
        return st

    def _write_status(self, pod, rt, terminal=False):
        status = self._status(pod, rt, terminal)
        st = self.store
        t = st.types[("", "v1", "pods")]
        with st.lock:
            cur = st.objs[PODS].get((rt.ns, rt.name))
            if cur is None or cur["metadata"]["uid"] != rt.uid:
                return
            old = cur.get("status") or {}
            new_status = dict(status)
            for k in ("qosClass", "nominatedNodeName"):
                if k in old:
                    new_status[k] = old[k]
            # The status manager's merge: conditions the kubelet does not own
            # stay (PodScheduled, the eviction API's DisruptionTarget unless
            # the kubelet sets its own).
            mine = {c["type"] for c in status["conditions"]}
            kept = [c for c in old.get("conditions") or []
                    if c.get("type") not in KUBELET_CONDITIONS and c.get("type") not in mine]
            new_status["conditions"] = status["conditions"][:4] + kept + status["conditions"][4:]
            if new_status == old:
                return
            new = copy.deepcopy(cur)
            new["status"] = new_status
            st._finish_update(t, cur, new, False)

    # -- admin and API hooks ------------------------------------------------------------------
    def evict(self, ns, name, message, grace=0):
        st = self.store
        with st.lock:
            pod = st.objs[PODS].get((ns, name))
            if pod is None:
                raise APIError(404, "NotFound", 'pods "%s" not found' % name, {"name": name, "kind": "pods"})
            uid = pod["metadata"]["uid"]
        with self.mu:
            rt = self.pods.get(uid)
            if rt is None or rt.finished:
                raise APIError(409, "Conflict", 'pod "%s" is not running on %s'
                               % (name, (pod.get("spec") or {}).get("nodeName") or NODE_NAME))
            rt.evicted = ("Evicted", message or "The node was low on resource: memory. ", max(0, int(grace or 0)))
        self.wake.set()
        self.log({"msg": "kubelet: evicting", "pod": "%s/%s" % (ns, name)})

    def log_source(self, pod, container, previous):
        """What GET pods/<name>/log reads (kubectl logs), or the real 400."""
        m = pod["metadata"]
        spec = pod.get("spec") or {}
        names = [c.get("name") for c in spec.get("containers") or []]
        if not container:
            if len(names) != 1:
                raise bad_request("a container name must be specified for pod %s, choose one of: [%s]"
                                  % (m["name"], " ".join(names)))
            container = names[0]
        if container not in names + [c.get("name") for c in spec.get("initContainers") or []]:
            raise bad_request("container %s is not valid for pod %s" % (container, m["name"]))
        with self.mu:
            rt = self.pods.get(m["uid"])
            c = (rt.containers.get(container) or rt.sidecars.get(container)) if rt else None
            if c is None or (c.log is None and not previous):
                reason = (c.state.get("waiting") or {}).get("reason", "ContainerCreating") if c \
                    else "ContainerCreating"
                if reason in ("ErrImagePull", "ImagePullBackOff"):
                    reason = "trying and failing to pull image"
                raise bad_request('container "%s" in pod "%s" is waiting to start: %s'
                                  % (container, m["name"], reason))
            if previous:
                if c.restarts == 0 or not c.prev_log:
                    raise bad_request('previous terminated container "%s" in pod "%s" not found'
                                      % (container, m["name"]))
                return LogSource(c.prev_log, lambda: False)
            path, proc = c.log, c.proc
        # Only the kubelet's thread reaps; returncode is set once it has.
        return LogSource(path, lambda: proc is not None and proc.returncode is None)

    def describe(self):
        with self.mu:
            node = self.cluster.get(NODE_NAME) or {}
            max_pods = int(((node.get("status") or {}).get("allocatable") or {}).get("pods") or 0)
            return {"maxPods": max_pods, "podCIDR": "127.%d.0.0/16" % self.ips.r,
                    "pods": {"%s/%s" % (rt.ns, rt.name): {
                        "ip": rt.ip, "dir": rt.dir, "saDir": rt.sa_dir,
                        "pids": {c.name: c.proc.pid for c in rt.every() if c.proc}}
                        for rt in self.pods.values()}}


if __name__ == "__main__" and sys.argv[1:] == ["--reaper"]:
    reaper_main()
elif __name__ == "__main__" and sys.argv[1:2] == ["--proxy"]:
    proxy_main()
