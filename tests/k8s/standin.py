#!/usr/bin/env python3
"""A local stand-in for the Kubernetes API server, for tests (issue 4).

  python3 tests/k8s/standin.py --dir DIR [--host 127.0.0.1]
      [--max-endpoints-per-slice 100] [--history 1000] [--bookmark-interval 1.0]
      [--kubelet] [--image PATTERN=DIR[=ENTRYPOINT]]... [--max-pods 110]
      [--backoff 10] [--backoff-max 300] [--gpus 0] [--node-label K=V]...
      [--pod-cidr 127.R.0.0/16] [--pass-env NAME]...
      [--nodes 1] [--zones Z1,Z2,...] [--racks R1,R2,...] [--rack-label KEY]
      [--pod-topology-labels KEY,...] [--autoscaler MAX_NODES]
      [--scale-up-delay 10] [--scale-down-unneeded 600]

With --kubelet (implied by --image and --autoscaler) a scheduler
(scheduler.py) and a kubelet (kubelet.py) run bound pods' containers as
local processes; without, pods are bound to the first node at creation and
nothing runs them (tests then play the kubelet themselves). Either way
there are Node objects (nodes.py): --nodes N of them (standin-node,
standin-node-1, ...), each with --max-pods, --gpus, the --node-label
labels, a zone from --zones and a rack from --racks; the scheduler's
binding copies node labels onto the pod as the PodTopologyLabels
admission plugin does (topology.k8s.io/zone and region, and the keys of
--pod-topology-labels, the plugin's configured ones); --autoscaler adds and removes nodes
between N and MAX_NODES (autoscaler.py). The disruption controller keeps
PDB status and pods/eviction honours it (disruption.py); the node
lifecycle controller's taints and PodGC run too (nodes.py).

Writes DIR/ca.crt, a server certificate, DIR/token (0600), DIR/kubeconfig
and last, atomically, DIR/ready = {"port", "admin_port", "pid"}. The API is
HTTPS with bearer tokens (the admin's is system:masters; service-account
tokens are authorized by RBAC). The admin API is plain HTTP on 127.0.0.1
for the tests only:
  POST /outage {"mode": refuse|503|none, "seconds"}    POST /compact
  POST /faults {"method", "resource", "count", "answer": 503|drop|conflict}:
       the next count requests of that method on that resource are applied,
       then their answer is lost (a 503 Status instead, or the connection
       cut); conflict: another writer changes the object (an annotation)
       just before a PUT is applied, so it meets a real 409
  GET /faults: {"left": armed requests not met yet}
  POST /admission {"resource", "namespace"?, "kind": quota|webhook, "message",
       "webhook"?, "code"?} | {"clear": true}: creates of that resource are
       refused as a ResourceQuota (403 "exceeded quota: ...") or a validating
       webhook (its code, default 400: "admission webhook ... denied the
       request: ...") refuses them, until cleared
  POST /tokens {"token", "user", "groups", "deny": ["res[:verb]"], "rbac"}
  POST /tokens/revoke {"token"}   POST /tokens/serviceaccount {"namespace", "name"}
  GET /history?resource=&namespace=&name=              GET /state
  GET /pods/NS/NAME (the pod)     POST /pods/NS/NAME/ready {"ready"} (no kubelet)
  POST /pods/NS/NAME/evict {"message", "grace"}: the kubelet's eviction (node pressure)
  GET|POST /node {"maxPods"}: the first node's pod capacity (null: 110) and the
       kubelet's pods {"maxPods", "podCIDR", "pods": {"NS/NAME": {"ip", "dir", "saDir", "pids"}}}
  GET /nodes: {"nodes": [{"name", "hostIP", "zone", "cordoned", "ready", "taints",
       "pods": ["NS/NAME" bound to it], "maxPods", "autoscaler"?: {"unneededFor": s|null,
       "unremovable": why|null, "draining"}}]}
  POST /nodes/NAME/reclaim {"notice": seconds (default 120)}: a spot interruption:
       cordoned, tainted karpenter.sh/disrupted:NoSchedule and NotReady at once, its
       pods stopped by the kubelet's graceful node shutdown, the Node deleted after
       the notice (PodGC then removes its pods); 404 unknown node, 409 no kubelet
Standard library only. What it reproduces and what not: the table at the
top of tests/integration/test_standin.c."""

import argparse
import base64
import copy
import json
import os
import random
import secrets
import select
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rbac  # noqa: E402
from apistore import Store  # noqa: E402
from autoscaler import Autoscaler  # noqa: E402
from controllers import EndpointSliceController, LocalNode, gc_loop  # noqa: E402
from disruption import DisruptionController, evict  # noqa: E402
from kubelet import Kubelet  # noqa: E402
from nodes import Cluster, NodeLifecycle  # noqa: E402
from k8slib import (APIError, bad_request, decode_protobuf, field_match, json_patch,  # noqa: E402
                    label_match, merge_patch, now_rfc3339, parse_field_selector, parse_label_selector,
                    status_body, strategic_merge_patch)

MERGE = "application/merge-patch+json"
JSONPATCH = "application/json-patch+json"
SMP = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


def log(rec):
    rec = dict(rec)
    rec.setdefault("ts", round(time.time(), 3))
    try:
        sys.stderr.write(json.dumps(rec) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


# ---- certificates, token, kubeconfig ----------------------------------------------

def make_certs(d, host):
    """A CA and a server certificate signed by it (EC P-256: instant to make,
    accepted by Go's and OpenSSL's TLS)."""
    def run(*args):
        subprocess.run(["openssl", *args], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=30)
    p = lambda n: os.path.join(d, n)  # noqa: E731
    run("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", p("ca.key"))
    run("req", "-x509", "-new", "-key", p("ca.key"), "-days", "3650", "-subj", "/CN=standin-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", p("ca.crt"))
    run("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", p("server.key"))
    run("req", "-new", "-key", p("server.key"), "-subj", "/CN=kube-apiserver", "-out", p("server.csr"))
    san = "IP:%s,DNS:localhost" % host
    if host != "127.0.0.1":
        san += ",IP:127.0.0.1"
    with open(p("server.ext"), "w") as f:
        f.write("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=serverAuth\nsubjectAltName=%s\n" % san)
    run("x509", "-req", "-in", p("server.csr"), "-CA", p("ca.crt"), "-CAkey", p("ca.key"),
        "-CAcreateserial", "-days", "3650", "-extfile", p("server.ext"), "-out", p("server.crt"))
    for n in ("server.csr", "server.ext", "ca.srl"):
        try:
            os.unlink(p(n))
        except OSError:
            pass


def write_file(path, text, mode=0o644):
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.rename(tmp, path)


def kubeconfig(d, host, port, token):
    return ("apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority: %s\n"
            "    server: https://%s:%d\n  name: standin\ncontexts:\n- context:\n"
            "    cluster: standin\n    namespace: default\n    user: standin-admin\n"
            "  name: standin\ncurrent-context: standin\nkind: Config\npreferences: {}\n"
            "users:\n- name: standin-admin\n  user:\n    token: %s\n"
            % (os.path.join(d, "ca.crt"), host, port, token))


# ---- the application: store, auth, outages ------------------------------------------

class App:
    def __init__(self, args):
        self.args = args
        self.store = Store(history=args.history, log=log)
        self.cluster = Cluster(self.store, args, log)
        self.kubelet = self.autoscaler = None
        if args.kubelet or args.image or args.autoscaler:
            self.kubelet = Kubelet(self.store, self, args, log)
            self.store.node = self.cluster.kubelet = self.kubelet
        else:
            self.store.node = LocalNode(self.store)
        if args.autoscaler:
            self.autoscaler = Autoscaler(self.store, self.cluster, args, log)
        # token -> {"user", "groups", "deny": [(resource, verb|None)], "rbac": bool,
        #           "sa"/"pod": (ns, name, uid) it is bound to, "exp": unix time}
        self.tokens = {}
        self.conns = set()
        self.conns_lock = threading.Lock()
        self.outage_mode, self.outage_until = "none", 0.0
        self.faults, self.faults_lock = [], threading.Lock()
        self.admission = []  # refusals armed by POST /admission
        self.reopen_timer = None
        self.server = None
        self.port = 0
        self.sslctx = None
        self.bookmark_interval = args.bookmark_interval

    # -- tokens
    def token_entry(self, tok):
        """The identity behind a bearer token, None when it is unknown or no
        longer valid: expired, or bound to a service account or pod that is
        gone (as the real service-account token authenticator checks)."""
        ent = self.tokens.get(tok)
        if ent is None:
            return None
        if ent.get("exp") and time.time() >= ent["exp"]:
            return None
        st = self.store
        with st.lock:
            for key, ref in (((("", "serviceaccounts")), ent.get("sa")), ((("", "pods")), ent.get("pod"))):
                if ref:
                    o = st.objs[key].get((ref[0], ref[1]))
                    if o is None or o["metadata"].get("uid") != ref[2]:
                        return None
        return ent

    def mint_sa_token(self, ns, sa, pod=None, seconds=None):
        """A token for service account ns/sa (optionally bound to a pod
        (ns, name, uid)); raises APIError 404 when the account is missing."""
        st = self.store
        with st.lock:
            o = st.objs[("", "serviceaccounts")].get((ns, sa))
            if o is None:
                raise APIError(404, "NotFound", 'serviceaccounts "%s" not found' % sa,
                               {"name": sa, "kind": "serviceaccounts"})
            uid = o["metadata"]["uid"]
        tok = "sa." + secrets.token_urlsafe(32)
        self.tokens[tok] = {"user": rbac.sa_user(ns, sa), "groups": rbac.sa_groups(ns), "deny": [],
                            "rbac": True, "sa": (ns, sa, uid), "pod": pod,
                            "exp": time.time() + seconds if seconds else None}
        return tok

    def track(self, sock, add):
        with self.conns_lock:
            (self.conns.add if add else self.conns.discard)(sock)

    # -- outages
    def start_api(self, port):
        srv = APIServer((self.args.host, port), APIHandler, self)
        self.server, self.port = srv, srv.server_address[1]
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def refuse(self, seconds):
        srv, self.server = self.server, None
        if srv is not None:
            srv.shutdown()
            srv.server_close()
        with self.conns_lock:
            for s in list(self.conns):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        with self.store.lock:
            self.store.epoch += 1
            self.store.cond.notify_all()
        self.outage_mode = "refuse"
        self.reopen_timer = threading.Timer(seconds, self.reopen)
        self.reopen_timer.daemon = True
        self.reopen_timer.start()

    def reopen(self):
        if self.reopen_timer:
            self.reopen_timer.cancel()
            self.reopen_timer = None
        if self.server is None:
            for _ in range(100):
                try:
                    self.start_api(self.port)
                    break
                except OSError:
                    time.sleep(0.05)
            else:
                log({"msg": "cannot listen on the API port again", "port": self.port})
        self.outage_mode = "none"
        log({"msg": "api listening again", "port": self.port})

    def take_fault(self, method, path):
        """The answer to lose for this request (None: answer it): the first
        armed fault whose method matches and whose resource is a segment of
        the path, counted down."""
        segs = [s for s in path.split("/") if s]
        with self.faults_lock:
            for f in self.faults:
                if f["method"] == method and f["resource"] in segs and f["count"] > 0:
                    f["count"] -= 1
                    return f["answer"]
        return None

    def in_503(self):
        if self.outage_mode == "503" and time.time() < self.outage_until:
            return True
        if self.outage_mode == "503":
            self.outage_mode = "none"
        return False


class APIServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr, handler, app):
        self.app = app
        super().__init__(addr, handler)

    def finish_request(self, request, client_address):
        # The TLS handshake runs here, on the connection's own thread, so a
        # slow or silent client cannot stall accept().
        request.settimeout(15)
        # Headers and body leave in separate writes: without NODELAY, Nagle
        # plus the client's delayed ACK adds ~40 ms to every response.
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            tls = self.app.sslctx.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):
            return
        self.app.track(tls, True)
        try:
            self.RequestHandlerClass(tls, client_address, self)
        except (OSError, ssl.SSLError):
            pass
        finally:
            self.app.track(tls, False)
            try:
                tls.close()
            except OSError:
                pass

    def handle_error(self, request, client_address):
        pass


def _qs(url):
    q = urllib.parse.parse_qs(url.query, keep_blank_values=True)
    return {k: v[-1] for k, v in q.items()}


def _truthy(v):
    return v in ("1", "true", "True")


class APIHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "standin"
    timeout = 300  # an idle keep-alive connection is closed after this

    def log_message(self, *a):
        pass

    @property
    def app(self):
        return self.server.app

    # -- plumbing
    def send_json(self, code, body, headers=None):
        if getattr(self, "lose", None) in ("503", "drop") and 200 <= code <= 299:
            return self.lose_answer(code)
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        for w in getattr(self, "warnings", None) or []:
            # As the real server: one Warning header per warning, code 299.
            self.send_header("Warning", '299 - %s' % json.dumps(w))
        self.end_headers()
        self.wfile.write(data)
        self.code = code

    def admit(self, t, ns, body):
        """Admission refusals armed by POST /admission, in the real API
        server's words: a ResourceQuota's 403, or a validating webhook's
        denial (its code; 400 when it gives none)."""
        md = body.get("metadata") if isinstance(body, dict) else None
        name = (md or {}).get("name") or (md or {}).get("generateName") or ""
        for r in list(self.app.admission):
            if r["resource"] != t.plural or r.get("namespace") not in (None, ns):
                continue
            if r["kind"] == "quota":
                raise APIError(403, "Forbidden", '%s "%s" is forbidden: exceeded quota: %s'
                               % (t.plural, name, r["message"]), {"name": name, "kind": t.plural})
            code = int(r.get("code") or 400)
            raise APIError(code, {400: "BadRequest", 403: "Forbidden", 422: "Invalid"}.get(code, ""),
                           'admission webhook "%s" denied the request: %s'
                           % (r.get("webhook") or "validate.example.com", r["message"]))

    def concurrent_write(self, t, ns, name):
        """A fault: someone else's write to the object, as kubectl annotate."""
        st = self.app.store
        with st.lock:
            cur = copy.deepcopy(st.get(t, ns, name))
            ann = cur["metadata"].setdefault("annotations", {})
            ann["standin.test/concurrent-write"] = str(int(ann.get("standin.test/concurrent-write", "0")) + 1)
            st.update(t, ns, name, cur)
        log({"fault": "conflict", "path": self.path})

    def lose_answer(self, code):
        """For an armed fault (POST /faults): the request has been applied;
        its success answer becomes a 503 Status or is never sent."""
        how, self.lose = self.lose, None
        log({"fault": how, "lost_code": code, "path": self.path})
        if how == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send_json(503, status_body(503, "ServiceUnavailable", "the server is currently unable "
                                        "to handle the request"))

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                n = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(n)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def json_body(self, raw, required=True, protobuf=False):
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if protobuf and "protobuf" in ctype:
            # kubectl's typed commands (create secret/configmap/namespace/
            # serviceaccount/role/rolebinding/token, auth can-i) send protobuf.
            try:
                o = decode_protobuf(raw)
            except (ValueError, IndexError):
                o = None
            if o is not None:
                return o
        if "protobuf" in ctype or "cbor" in ctype:
            # Only JSON is spoken here, and protobuf for the kinds above
            # (apply and create -f send JSON).
            raise APIError(415, "UnsupportedMediaType",
                           "the body of the request was in an unknown format - accepted media types "
                           "include: application/json, application/yaml")
        if not raw.strip():
            if required:
                raise bad_request("the body of the request was empty")
            return None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise bad_request("the body of the request was in an unknown format or is not valid "
                              "JSON: %s" % e)

    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")

    def do_PUT(self):
        self.dispatch("PUT")

    def do_PATCH(self):
        self.dispatch("PATCH")

    def do_DELETE(self):
        self.dispatch("DELETE")

    def dispatch(self, method):
        t0 = time.time()
        self.code = 0
        self.user = "-"
        self.warnings = []
        url = urllib.parse.urlsplit(self.path)
        self.lose = self.app.take_fault(method, url.path)
        try:
            raw = self.read_body()
            self.route(method, url, _qs(url), raw)
        except APIError as e:
            self.send_json(e.code, e.body(), e.headers)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self.close_connection = True
        except OSError:
            self.close_connection = True
        except Exception as e:  # a bug in the stand-in: say so, as a 500 Status
            log({"msg": "internal error", "error": repr(e), "path": url.path})
            try:
                self.send_json(500, status_body(500, "InternalError",
                                                "Internal error occurred: %r" % e))
            except OSError:
                self.close_connection = True
        log({"method": method, "path": url.path, "query": url.query, "code": self.code,
             "user": self.user, "ms": round((time.time() - t0) * 1000, 1)})

    # -- auth
    def authenticate(self):
        h = self.headers.get("Authorization", "")
        tok = h[7:].strip() if h.startswith("Bearer ") else None
        ent = self.app.token_entry(tok) if tok else None
        if ent is None:
            raise APIError(401, "Unauthorized", "Unauthorized")
        self.user = ent["user"]
        return self.impersonate(ent)

    def impersonate(self, ent):
        """Impersonate-User/-Group headers (kubectl --as/--as-group): allowed
        to system:masters and to the test tokens without RBAC. A service
        account's name brings its fixed groups when no group is given."""
        who = self.headers.get("Impersonate-User")
        groups = self.headers.get_all("Impersonate-Group") or []
        if not who:
            if groups:
                raise bad_request("requested [%s] without impersonating a user"
                                  % ", ".join("{Group  %s  authentication.k8s.io/v1  }" % g for g in groups))
            return ent
        if ent.get("rbac") and rbac.MASTERS not in ent.get("groups", []):
            raise APIError(403, "Forbidden", 'users "%s" is forbidden: User "%s" cannot impersonate '
                           'resource "users" in API group "" at the cluster scope' % (who, ent["user"]),
                           {"name": who, "kind": "users"})
        parts = who.split(":")
        if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"] and not groups:
            groups = rbac.sa_groups(parts[2])[:2]
        if who != "system:anonymous" and "system:authenticated" not in groups:
            groups = groups + ["system:authenticated"]
        self.user = "%s (as %s)" % (ent["user"], who)
        return {"user": who, "groups": groups, "deny": [], "rbac": True}

    def authorize(self, ent, verb, t, ns, name, sub):
        res = t.plural + ("/" + sub if sub else "")
        if ent.get("rbac"):
            if t.group == "authorization.k8s.io" and verb == "create" and \
                    t.plural in ("selfsubjectaccessreviews", "selfsubjectrulesreviews"):
                return  # system:basic-user, bound to system:authenticated
            ok, why = rbac.authorize(self.app.store, ent["user"], ent.get("groups") or [], verb,
                                     t.group, t.plural, sub, ns, name)
            if not ok:
                raise rbac.forbidden(t.qualified, t.plural, t.group, ent["user"], verb, sub, ns, name, why)
            return
        for r, v in ent["deny"]:
            if (r == t.plural or r == res) and (v is None or v == verb):
                raise rbac.forbidden(t.qualified, t.plural, t.group, ent["user"], verb, sub, ns, name)

    # -- routing
    def route(self, method, url, q, raw):
        app, st = self.app, self.app.store
        if app.in_503():
            raise APIError(503, "ServiceUnavailable", "the server is currently unable to handle the "
                           "request", {"retryAfterSeconds": 1}, {"Retry-After": "1"})
        path = url.path
        if path in ("/healthz", "/livez", "/readyz"):
            data = b"ok"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(data)
            self.code = 200
            return
        ent = self.authenticate()
        segs = [s for s in path.split("/") if s]
        if method == "GET" and segs == ["version"]:
            return self.send_json(200, {"major": "1", "minor": "32", "gitVersion": "v1.32.0-standin",
                                        "gitCommit": "0000000000000000000000000000000000000000",
                                        "gitTreeState": "clean", "buildDate": "2024-12-11T00:00:00Z",
                                        "goVersion": "go1.23.4", "compiler": "gc",
                                        "platform": "linux/amd64"})
        if method == "GET" and segs == ["api"]:
            return self.send_json(200, {"kind": "APIVersions", "versions": ["v1"],
                                        "serverAddressByClientCIDRs": [
                                            {"clientCIDR": "0.0.0.0/0",
                                             "serverAddress": "%s:%d" % (app.args.host, app.port)}]})
        if method == "GET" and segs == ["apis"]:
            with st.lock:
                groups = [self.group_obj(g, vs) for g, vs in st.groups() if g != ""]
            return self.send_json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        if segs and segs[0] == "openapi" and method == "GET":
            return self.openapi(segs[1:])
        if len(segs) >= 2 and segs[0] == "api":
            group, version, rest = "", segs[1], segs[2:]
        elif len(segs) == 2 and segs[0] == "apis" and method == "GET":
            with st.lock:
                for g, vs in st.groups():
                    if g == segs[1] and g != "":
                        return self.send_json(200, dict(self.group_obj(g, vs), kind="APIGroup",
                                                        apiVersion="v1"))
            raise APIError(404, "NotFound", "the server could not find the requested resource")
        elif len(segs) >= 3 and segs[0] == "apis":
            group, version, rest = segs[1], segs[2], segs[3:]
        else:
            raise APIError(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            if method != "GET":
                raise APIError(405, "MethodNotAllowed", "the server does not allow this method on the "
                               "requested resource")
            return self.send_json(200, self.resource_list(group, version))
        return self.resource(method, q, raw, group, version, rest, ent)

    def openapi(self, segs):
        """Just enough OpenAPI v3 for kubectl 1.32: the root index, and per
        group-version a document whose PATCH operations name their kind and
        declare the fieldValidation query parameter, so kubectl leaves
        validation to the server (as against a real one) instead of
        downloading schemas. No schemas: kubectl then builds strategic merge
        patches from its compiled-in types, as it does for built-ins anyway.
        /openapi/v2 stays 404."""
        st = self.app.store
        with st.lock:
            types = list(st.types.values())
        gvs = sorted({(t.group, t.version) for t in types})
        def gvpath(g, v):
            return "api/" + v if g == "" else "apis/%s/%s" % (g, v)
        digest = "%08x" % (hash(tuple(sorted((t.group, t.version, t.plural) for t in types))) & 0xffffffff)
        if segs == ["v3"]:
            return self.send_json(200, {"paths": {gvpath(g, v): {
                "serverRelativeURL": "/openapi/v3/%s?hash=%s" % (gvpath(g, v), digest)}
                for g, v in gvs}})
        if len(segs) >= 3 and segs[0] == "v3":
            want = "/".join(segs[1:])
            paths = {}
            for t in types:
                if gvpath(t.group, t.version) != want:
                    continue
                base = "/" + want + ("/namespaces/{namespace}/" if t.namespaced else "/") + t.plural
                gvk = {"group": t.group, "version": t.version, "kind": t.kind}
                params = [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                          {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                          {"name": "dryRun", "in": "query", "schema": {"type": "string"}}]
                paths[base + "/{name}"] = {
                    "patch": {"operationId": "patch" + t.kind, "x-kubernetes-action": "patch",
                              "parameters": params,
                              "x-kubernetes-group-version-kind": gvk,
                              "responses": {"200": {"description": "OK"}}}}
                paths[base] = {
                    "post": {"operationId": "create" + t.kind, "x-kubernetes-action": "post",
                             "parameters": params,
                             "x-kubernetes-group-version-kind": gvk,
                             "responses": {"201": {"description": "Created"}}}}
            if paths:
                return self.send_json(200, {"openapi": "3.0.0",
                                            "info": {"title": "Kubernetes", "version": "v1.32.0"},
                                            "paths": paths, "components": {"schemas": {}}})
        raise APIError(404, "NotFound", "the server could not find the requested resource")

    def group_obj(self, g, vs):
        gvs = [{"groupVersion": "%s/%s" % (g, v), "version": v} for v in vs]
        return {"name": g, "versions": gvs, "preferredVersion": gvs[0]}

    def resource_list(self, group, version):
        st = self.app.store
        with st.lock:
            ts = [t for t in st.types.values() if t.group == group and t.version == version]
        if not ts:
            raise APIError(404, "NotFound", "the server could not find the requested resource")
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        out = []
        for t in sorted(ts, key=lambda x: x.plural):
            r = {"name": t.plural, "singularName": t.singular, "namespaced": t.namespaced,
                 "kind": t.kind, "verbs": t.verbs or verbs}
            if t.short:
                r["shortNames"] = t.short
            if t.categories:
                r["categories"] = t.categories
            out.append(r)
            if t.scale:
                out.append({"name": t.plural + "/scale", "singularName": "", "namespaced": t.namespaced,
                            "group": "autoscaling", "version": "v1", "kind": "Scale",
                            "verbs": ["get", "patch", "update"]})
            if t.status:
                out.append({"name": t.plural + "/status", "singularName": "",
                            "namespaced": t.namespaced, "kind": t.kind,
                            "verbs": ["get", "patch", "update"]})
            if t.key == ("", "pods"):
                out.append({"name": "pods/eviction", "singularName": "", "namespaced": True,
                            "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]})
                out.append({"name": "pods/log", "singularName": "", "namespaced": True,
                            "kind": "Pod", "verbs": ["get"]})
            if t.key == ("", "serviceaccounts"):
                out.append({"name": "serviceaccounts/token", "singularName": "", "namespaced": True,
                            "group": "authentication.k8s.io", "version": "v1",
                            "kind": "TokenRequest", "verbs": ["create"]})
        gv = version if group == "" else group + "/" + version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out}

    def resource(self, method, q, raw, group, version, rest, ent):
        st = self.app.store
        watch_path = False
        if rest[0] == "watch":
            watch_path, rest = True, rest[1:]
            if not rest:
                raise APIError(404, "NotFound", "the server could not find the requested resource")
        ns = name = sub = None
        with st.lock:
            nt = st.find_type(group, version, rest[2]) if len(rest) >= 3 and rest[0] == "namespaces" else None
            if nt is not None and nt.namespaced:
                t, ns, tail = nt, rest[1], rest[3:]
            else:
                t, tail = st.find_type(group, version, rest[0]), rest[1:]
        if t is None or len(tail) > 2:
            raise APIError(404, "NotFound", "the server could not find the requested resource")
        name = tail[0] if tail else None
        sub = tail[1] if len(tail) > 1 else None
        if t.namespaced and ns is None and name is not None:
            raise APIError(404, "NotFound", "the server could not find the requested resource")
        extra = {("", "pods"): ("log", "eviction"), ("", "serviceaccounts"): ("token",)}.get(t.key, ())
        if (sub == "status" and not t.status) or (sub == "scale" and not t.scale) or \
                sub not in (None, "status", "scale") + extra:
            raise APIError(404, "NotFound", "the server could not find the requested resource")
        is_watch = watch_path or (method == "GET" and _truthy(q.get("watch")))
        fv = q.get("fieldValidation") or "Warn"
        if fv not in ("Ignore", "Warn", "Strict"):
            raise bad_request('fieldValidation: Unsupported value: "%s": supported values: '
                              '"Ignore", "Strict", "Warn"' % fv)
        verb = {"GET": "watch" if is_watch else ("get" if name else "list"), "POST": "create",
                "PUT": "update", "PATCH": "patch",
                "DELETE": "delete" if name else "deletecollection"}[method]
        authz_name = name
        if verb in ("list", "watch") and not name:
            # As the real request-info resolver: a list or watch narrowed to
            # one object by fieldSelector metadata.name= carries that name.
            for k, op, v in parse_field_selector(q.get("fieldSelector"), t.fields):
                if k == "metadata.name" and op == "=":
                    authz_name = v
        self.authorize(ent, verb, t, ns, authz_name, sub)
        dry = q.get("dryRun") == "All"
        if sub in ("log", "token", "eviction") or t.verbs:
            return self.special(method, q, raw, t, ns, name, sub, ent)
        if is_watch:
            if sub:
                raise APIError(404, "NotFound", "the server could not find the requested resource")
            return self.watch(t, ns, name, q)
        if method == "GET" and name is None:
            return self.list(t, ns, q)
        if method == "GET":
            obj = st.get(t, ns, name)
            if sub == "scale":
                return self.send_json(200, st.scale_of(t, obj))
            if "as=Table" in self.headers.get("Accept", ""):
                return self.send_json(200, dict(st.table(t, [obj], q.get("includeObject", "Metadata")),
                                                metadata={"resourceVersion": obj["metadata"]["resourceVersion"]}))
            return self.send_json(200, st.out(t, obj))
        if method == "POST":
            if name is not None:
                raise APIError(405, "MethodNotAllowed", "the server does not allow this method on "
                               "the requested resource")
            if t.namespaced and ns is None:
                raise APIError(404, "NotFound", "the server could not find the requested resource")
            body = self.json_body(raw, protobuf=True)
            if t.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
                st.validate_crd(body)
            self.admit(t, ns, body)
            return self.send_json(201, st.out(t, st.create(t, ns, body, dry_run=dry, fv=fv,
                                                           warnings=self.warnings)))
        if method == "PUT":
            if name is None:
                raise APIError(405, "MethodNotAllowed", "the server does not allow this method on "
                               "the requested resource")
            body = self.json_body(raw, protobuf=True)
            if sub == "scale":
                return self.send_json(200, st.scale_of(t, st.set_scale(t, ns, name, body)))
            if t.key == ("apiextensions.k8s.io", "customresourcedefinitions") and sub is None:
                st.validate_crd(body)
            if self.lose == "conflict":
                self.lose = None
                self.concurrent_write(t, ns, name)
            return self.send_json(200, st.out(t, st.update(t, ns, name, body, sub=sub, dry_run=dry,
                                                           fv=fv, warnings=self.warnings)))
        if method == "PATCH":
            if name is None:
                raise APIError(405, "MethodNotAllowed", "the server does not allow this method on "
                               "the requested resource")
            return self.patch(t, ns, name, sub, raw, dry, q)
        if method == "DELETE":
            if name is None:
                return self.delete_collection(t, ns, q)
            opts = self.json_body(raw, required=False) or {}
            if not isinstance(opts, dict):
                raise bad_request("DeleteOptions must be a JSON object")
            for k in ("propagationPolicy", "gracePeriodSeconds"):
                if k in q:
                    opts[k] = int(q[k]) if k == "gracePeriodSeconds" else q[k]
            if dry:
                opts["dryRun"] = True
            obj, gone = st.delete(t, ns, name, opts)
            # As the real handler: 202 only for a pending delete that asked
            # orphanDependents=false; stores other than pods and
            # serviceaccounts answer an immediate delete with a Status.
            code = 202 if (not gone and opts.get("orphanDependents") is False) else 200
            if gone and t.key not in (("", "pods"), ("", "serviceaccounts")):
                m = obj["metadata"]
                d = {"name": name, "kind": t.plural, "uid": m.get("uid")}
                if t.group:
                    d["group"] = t.group
                return self.send_json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                            "status": "Success", "details": d})
            return self.send_json(code, st.out(t, obj))
        raise APIError(405, "MethodNotAllowed", "the server does not allow this method")

    # -- subresources that are not stored objects
    def special(self, method, q, raw, t, ns, name, sub, ent):
        st = self.app.store
        if sub == "log":
            if method != "GET":
                raise APIError(405, "MethodNotAllowed", "the server does not allow this method on "
                               "the requested resource")
            return self.pod_log(ns, name, q)
        if sub == "token":
            if method != "POST":
                raise APIError(405, "MethodNotAllowed", "the server does not allow this method on "
                               "the requested resource")
            return self.token_request(ns, name, raw)
        if sub == "eviction":
            if method != "POST":
                raise APIError(405, "MethodNotAllowed", "the server does not allow this method on "
                               "the requested resource")
            body = self.json_body(raw, protobuf=True)
            return self.send_json(201, evict(st, ns, name, body, dry_run=q.get("dryRun") == "All"))
        if t.key == ("authorization.k8s.io", "selfsubjectaccessreviews"):
            if method != "POST" or name:
                raise APIError(405, "MethodNotAllowed", "the server does not allow this method on "
                               "the requested resource")
            body = self.json_body(raw, protobuf=True)
            spec = (body or {}).get("spec") or {}
            ra = spec.get("resourceAttributes")
            allowed, why = True, ""
            if isinstance(ra, dict):
                if ent.get("rbac"):
                    allowed, why = rbac.authorize(st, ent["user"], ent.get("groups") or [],
                                                  ra.get("verb", ""), ra.get("group", ""),
                                                  ra.get("resource", ""), ra.get("subresource", ""),
                                                  ra.get("namespace", ""), ra.get("name", ""))
                else:
                    res = ra.get("resource", "") + ("/" + ra["subresource"] if ra.get("subresource") else "")
                    allowed = not any((r == ra.get("resource") or r == res) and (v is None or
                                                                                  v == ra.get("verb"))
                                      for r, v in ent["deny"])
            out = {"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
                   "metadata": {"creationTimestamp": None}, "spec": spec,
                   "status": {"allowed": allowed}}
            if why:
                out["status"]["reason"] = why
            return self.send_json(201, out)
        raise APIError(405, "MethodNotAllowed", "the server does not allow this method on the "
                       "requested resource")

    def token_request(self, ns, name, raw):
        """TokenRequest (kubectl create token): a token for the service
        account, bound to a pod when spec.boundObjectRef names one."""
        body = self.json_body(raw, required=False, protobuf=True) or {}
        spec = dict(body.get("spec") or {}) if isinstance(body, dict) else {}
        secs = spec.get("expirationSeconds") or 3600
        if not isinstance(secs, int) or secs < 600:
            raise APIError(422, "Invalid", 'TokenRequest.authentication.k8s.io "%s" is invalid: '
                           'spec.expirationSeconds: Invalid value: %s: may not specify a duration less '
                           'than 10 minutes' % (name, json.dumps(secs)),
                           {"name": name, "group": "authentication.k8s.io", "kind": "TokenRequest"})
        pod = None
        ref = spec.get("boundObjectRef")
        if isinstance(ref, dict) and ref.get("kind") == "Pod":
            st = self.app.store
            with st.lock:
                po = st.objs[("", "pods")].get((ns, ref.get("name")))
                if po is None or (ref.get("uid") and ref["uid"] != po["metadata"]["uid"]):
                    raise APIError(404, "NotFound", 'pods "%s" not found' % ref.get("name"),
                                   {"name": ref.get("name"), "kind": "pods"})
                pod = (ns, ref["name"], po["metadata"]["uid"])
        tok = self.app.mint_sa_token(ns, name, pod=pod, seconds=secs)
        spec.setdefault("audiences", ["https://kubernetes.default.svc.cluster.local"])
        spec["expirationSeconds"] = secs
        spec.setdefault("boundObjectRef", None)
        return self.send_json(201, {
            "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": None},
            "spec": spec,
            "status": {"token": tok, "expirationTimestamp": now_rfc3339(time.time() + secs)}})

    def pod_log(self, ns, name, q):
        node = self.app.store.node
        st = self.app.store
        with st.lock:
            pod = st.get(st.types[("", "v1", "pods")], ns, name)
        getter = getattr(node, "log_source", None)
        if getter is None:
            cs = (pod.get("spec") or {}).get("containers") or []
            c = q.get("container") or (cs[0].get("name") if len(cs) == 1 else None)
            raise bad_request('container "%s" in pod "%s" is waiting to start: ContainerCreating'
                              % (c, name))
        src = getter(pod, q.get("container"), _truthy(q.get("previous")))
        try:
            tail = int(q["tailLines"]) if q.get("tailLines") else None
            limit = int(q["limitBytes"]) if q.get("limitBytes") else None
        except ValueError:
            raise bad_request("invalid tailLines or limitBytes")
        follow = _truthy(q.get("follow"))
        try:
            with open(src.path, "rb") as f:
                data = f.read()
        except OSError:
            data = b""
        pos = len(data)
        if tail is not None:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-tail:]) if tail > 0 else b""
        if limit is not None:
            data = data[:limit]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Cache-Control", "no-cache, private")
        if not follow:
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.code = 200
            return
        # follow: stream what the container writes until it ends.
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.code = 200
        sent = len(data)
        try:
            if data:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            while limit is None or sent < limit:
                alive = src.alive()
                try:
                    with open(src.path, "rb") as f:
                        f.seek(pos)
                        more = f.read()
                except OSError:
                    more = b""
                pos += len(more)
                if limit is not None:
                    more = more[:limit - sent]
                if more:
                    sent += len(more)
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(more), more))
                    self.wfile.flush()
                elif not alive:
                    break
                elif select.select([self.connection], [], [], 0)[0]:
                    self.close_connection = True  # the client hung up
                    return None
                else:
                    time.sleep(0.1)
            self.end_stream()
        except (OSError, ssl.SSLError):
            self.close_connection = True

    def patch(self, t, ns, name, sub, raw, dry, q):
        st = self.app.store
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        accepted = [JSONPATCH, MERGE, APPLY] + ([] if t.crd else [SMP])
        if ctype not in accepted:
            raise APIError(415, "UnsupportedMediaType",
                           "the body of the request was in an unknown format - accepted media types "
                           "include: %s" % ", ".join(accepted))
        patch = self.json_body(raw)
        code, body = self._patch_locked(t, ns, name, sub, patch, ctype, dry, q)
        return self.send_json(code, body)

    def _patch_locked(self, t, ns, name, sub, patch, ctype, dry, q):
        """Read-modify-write under the store lock; the caller sends the reply."""
        st = self.app.store
        fv = q.get("fieldValidation") or "Warn"
        with st.lock:
            try:
                cur = st.get(t, ns, name)
            except APIError:
                if ctype != APPLY or sub:
                    raise
                if not isinstance(patch, dict):
                    raise bad_request("apply patch must be an object")
                if not q.get("fieldManager"):
                    raise bad_request("PATCH, fieldManager: Required value: is required for apply patch")
                return 201, st.out(t, st.create(t, ns, patch, dry_run=dry, fv=fv, warnings=self.warnings))
            base = st.scale_of(t, cur) if sub == "scale" else st.out(t, cur)
            if ctype == JSONPATCH:
                new = json_patch(base, patch)
            elif ctype == SMP:
                if not isinstance(patch, dict):
                    raise bad_request("strategic merge patch must be a JSON object")
                new = strategic_merge_patch(base, patch)
            else:
                if ctype == APPLY and not q.get("fieldManager"):
                    raise bad_request("PATCH, fieldManager: Required value: is required for apply patch")
                if not isinstance(patch, dict) and ctype == APPLY:
                    raise bad_request("apply patch must be an object")
                new = merge_patch(base, patch)
            if not isinstance(new, dict):
                raise bad_request("the patch did not result in an object")
            if sub == "scale":
                return 200, st.scale_of(t, st.set_scale(t, ns, name, new))
            return 200, st.out(t, st.update(t, ns, name, new, sub=sub, dry_run=dry, require_rv=False,
                                            fv=fv, warnings=self.warnings))

    # -- list / watch
    def selectors(self, t, name, q):
        lsel = parse_label_selector(q.get("labelSelector"))
        fsel = parse_field_selector(q.get("fieldSelector"), t.fields)
        if name is not None:
            fsel.append(("metadata.name", "=", name))
        return lsel, fsel

    def list(self, t, ns, q):
        st = self.app.store
        lsel, fsel = self.selectors(t, None, q)
        rvq, match, cont = q.get("resourceVersion", ""), q.get("resourceVersionMatch", ""), q.get("continue", "")
        limit = 0
        if q.get("limit"):
            try:
                limit = max(0, int(q["limit"]))
            except ValueError:
                raise bad_request("invalid limit: %s" % q["limit"])
        start = None
        with st.lock:
            if cont:
                if rvq:
                    raise bad_request("specifying resource version is not allowed when using continue")
                try:
                    tok = json.loads(base64.b64decode(cont))
                    at, start = int(tok["rv"]), tuple(tok["start"])
                except (ValueError, KeyError, TypeError):
                    raise bad_request("continue key is not valid: incorrect encoded start resourceVersion")
                if at < st.floor:
                    raise APIError(410, "Expired", "The provided continue parameter is too old to "
                                   "display a consistent list result. You can start a new list without "
                                   "the continue parameter, or use the continue value from the response.")
            elif rvq not in ("", "0") or match:
                try:
                    want = int(rvq)
                except ValueError:
                    raise bad_request("resourceVersion: Invalid value: \"%s\": invalid value, must be an "
                                      "integer" % rvq)
                if match not in ("", "Exact", "NotOlderThan"):
                    raise bad_request('resourceVersionMatch: Unsupported value: "%s"' % match)
                if want > st.rv:
                    raise APIError(504, "Timeout", "Too large resource version: %d, current: %d"
                                   % (want, st.rv), {"causes": [{"reason": "ResourceVersionTooLarge",
                                                                 "message": "Too large resource version"}],
                                                     "retryAfterSeconds": 1})
                if match == "Exact" and want < st.floor:
                    raise APIError(410, "Expired", "too old resource version: %d (%d)" % (want, st.floor))
                at = want if match == "Exact" else st.rv
            else:
                at = st.rv
            items = st.snapshot(t, ns, at)
        items = [o for o in items if label_match(lsel, o["metadata"].get("labels"))
                 and field_match(fsel, o)]
        if start is not None:
            items = [o for o in items if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > start]
        meta = {"resourceVersion": str(at)}
        if limit and len(items) > limit:
            last = items[limit - 1]["metadata"]
            meta["continue"] = base64.b64encode(json.dumps(
                {"rv": at, "start": [last.get("namespace", ""), last["name"]]}).encode()).decode()
            if not lsel and not fsel:
                meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        if "as=Table" in self.headers.get("Accept", ""):
            tbl = st.table(t, items, q.get("includeObject", "Metadata"))
            tbl["metadata"] = meta
            return self.send_json(200, tbl)
        out = []
        for o in items:
            o = st.out(t, o)
            if t.crd is None:  # the real server leaves kind/apiVersion off built-in list items
                o.pop("kind", None)
                o.pop("apiVersion", None)
            out.append(o)
        return self.send_json(200, {"kind": t.kind + "List", "apiVersion": t.gv, "metadata": meta,
                                    "items": out})

    def delete_collection(self, t, ns, q):
        st = self.app.store
        lsel, fsel = self.selectors(t, None, q)
        with st.lock:
            items = [o for o in st.snapshot(t, ns) if label_match(lsel, o["metadata"].get("labels"))
                     and field_match(fsel, o)]
            out = []
            for o in items:
                try:
                    obj, _ = st.delete(t, o["metadata"].get("namespace"), o["metadata"]["name"], {})
                    out.append(st.out(t, obj))
                except APIError:
                    pass
            rv = st.rv
        return self.send_json(200, {"kind": t.kind + "List", "apiVersion": t.gv,
                                    "metadata": {"resourceVersion": str(rv)}, "items": out})

    def chunk(self, obj):
        data = (json.dumps(obj) + "\n").encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def watch(self, t, ns, name, q):
        st = self.app.store
        lsel, fsel = self.selectors(t, name, q)
        rvq = q.get("resourceVersion", "")
        try:
            timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else 1800 * (1 + random.random())
        except ValueError:
            raise bad_request("invalid timeoutSeconds")
        bookmarks = _truthy(q.get("allowWatchBookmarks"))
        initial_end = _truthy(q.get("sendInitialEvents"))
        if initial_end and not bookmarks:
            raise APIError(422, "Invalid", "sendInitialEvents requires allowWatchBookmarks=true")
        expired = None
        initial = []
        with st.lock:
            epoch = st.epoch
            if rvq in ("", "0") or initial_end:
                initial = st.snapshot(t, ns)
                cursor = st.rv
            else:
                try:
                    cursor = int(rvq)
                except ValueError:
                    raise bad_request("invalid resource version: %s" % rvq)
                if cursor < st.floor:
                    expired = (cursor, st.floor)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.code = 200

        def matches(o):
            return o is not None and (ns is None or o["metadata"].get("namespace") == ns) and \
                label_match(lsel, o["metadata"].get("labels")) and field_match(fsel, o)

        def bookmark(rv, end=False):
            m = {"resourceVersion": str(rv)}
            if end:
                m["annotations"] = {"k8s.io/initial-events-end": "true"}
            self.chunk({"type": "BOOKMARK", "object": {"kind": t.kind, "apiVersion": t.gv,
                                                       "metadata": m}})

        try:
            if expired:
                self.chunk({"type": "ERROR", "object": status_body(
                    410, "Expired", "too old resource version: %d (%d)" % expired)})
                return self.end_stream()
            for o in initial:
                if matches(o):
                    self.chunk({"type": "ADDED", "object": st.out(t, o)})
            if initial_end:
                bookmark(cursor, True)
            deadline = time.time() + timeout
            next_bm = time.time() + self.app.bookmark_interval
            while True:
                evs, lost, finish = [], False, None
                with st.lock:  # no socket I/O while holding it: a stopped client must not stall others
                    idle_since = time.time()
                    while True:
                        now = time.time()
                        if st.epoch != epoch:
                            finish = "drop"
                            break
                        if now >= deadline:
                            finish = "end"
                            break
                        if cursor < st.floor:
                            lost = True
                            break
                        if st.rv > cursor:
                            break
                        if bookmarks and now >= next_bm:
                            break
                        if now - idle_since >= 1.0:
                            finish = "tick"
                            break
                        wait = deadline - now
                        if bookmarks:
                            wait = min(wait, next_bm - now)
                        st.cond.wait(max(0.001, min(wait, 1.0)))
                    if not lost and not finish:
                        for ev in reversed(st.history):
                            if ev.rv <= cursor:
                                break
                            if ev.key == t.key:
                                evs.append(ev)
                        evs.reverse()
                        cursor = st.rv
                        evs = [(ev.type, st.out(t, ev.obj) if ev.obj else None,
                                ev.prev) for ev in evs]
                if finish == "drop":  # an outage: the connection is already cut
                    self.close_connection = True
                    return None
                if finish == "end":
                    return self.end_stream()
                if finish == "tick":
                    # A watch client sends nothing; readable means it hung up.
                    if select.select([self.connection], [], [], 0)[0]:
                        self.close_connection = True
                        return None
                    if not (bookmarks and time.time() >= next_bm):
                        continue
                if lost:
                    self.chunk({"type": "ERROR", "object": status_body(
                        410, "Expired", "too old resource version: %d (%d)" % (cursor, st.floor))})
                    return self.end_stream()
                for typ, obj, prev in evs:
                    if typ == "ADDED":
                        send = "ADDED" if matches(obj) else None
                    elif typ == "DELETED":
                        send = "DELETED" if matches(prev) else None
                    else:
                        was, now_m = matches(prev), matches(obj)
                        send = ("MODIFIED" if was else "ADDED") if now_m else ("DELETED" if was else None)
                    if send:
                        self.chunk({"type": send, "object": obj})
                if bookmarks and time.time() >= next_bm:
                    bookmark(cursor)
                    next_bm = time.time() + self.app.bookmark_interval
        except (OSError, ssl.SSLError):
            self.close_connection = True

    def end_stream(self):
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


# ---- admin API (plain HTTP, tests only) ---------------------------------------------

class AdminHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.guarded("GET")

    def do_POST(self):
        self.guarded("POST")

    def guarded(self, method):
        try:
            self.handle_admin(method)
        except (ValueError, TypeError, KeyError) as e:
            self.reply(400, {"error": "bad admin request: %s" % e})

    def handle_admin(self, method):
        app = self.server.app
        st = app.store
        url = urllib.parse.urlsplit(self.path)
        q = _qs(url)
        n = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(n) or b"{}") if n else {}
        except ValueError:
            return self.reply(400, {"error": "body is not JSON"})
        if not isinstance(body, dict):
            return self.reply(400, {"error": "body must be a JSON object"})
        p = url.path
        log({"admin": method, "path": p})
        if method == "POST" and p == "/outage":
            mode = body.get("mode")
            secs = float(body.get("seconds", 5))
            if mode == "none":
                app.outage_mode = "none"
                if app.server is None:
                    app.reopen()
                return self.reply(200, {"mode": "none"})
            if mode == "503":
                app.outage_until = time.time() + secs
                app.outage_mode = "503"
                return self.reply(200, {"mode": "503", "seconds": secs})
            if mode == "refuse":
                if app.server is not None:
                    app.refuse(secs)
                return self.reply(200, {"mode": "refuse", "seconds": secs, "port": app.port})
            return self.reply(400, {"error": "mode must be refuse, 503 or none"})
        if method == "POST" and p == "/faults":
            how = body.get("answer", "503")
            if how not in ("503", "drop", "conflict") or not body.get("method") or not body.get("resource"):
                return self.reply(400, {"error": "faults need method, resource and answer 503, drop or "
                                                 "conflict"})
            with app.faults_lock:
                app.faults.append({"method": str(body["method"]).upper(), "resource": str(body["resource"]),
                                   "count": int(body.get("count", 1)), "answer": how})
            return self.reply(200, {"armed": len(app.faults)})
        if method == "POST" and p == "/admission":
            if body.get("clear"):
                app.admission = []
                return self.reply(200, {"rules": 0})
            if body.get("kind") not in ("quota", "webhook") or not body.get("resource") or \
                    not isinstance(body.get("message"), str):
                return self.reply(400, {"error": "admission needs resource, kind quota or webhook, message"})
            app.admission = app.admission + [body]
            return self.reply(200, {"rules": len(app.admission)})
        if method == "GET" and p == "/faults":  # how many armed requests are still to come
            with app.faults_lock:
                return self.reply(200, {"left": sum(f["count"] for f in app.faults)})
        if method == "POST" and p == "/compact":
            st.compact()
            return self.reply(200, {"compacted_at": str(st.rv)})
        if method == "POST" and p == "/tokens":
            tok = body.get("token")
            if not isinstance(tok, str) or not tok:
                return self.reply(400, {"error": "token must be a non-empty string"})
            deny = []
            for d in body.get("deny") or []:
                r, _, v = str(d).partition(":")
                deny.append((r, v or None))
            user = body.get("user") or "system:serviceaccount:default:test"
            groups = body.get("groups")
            if groups is None:
                parts = user.split(":")
                groups = rbac.sa_groups(parts[2]) if len(parts) == 4 and parts[1] == "serviceaccount" \
                    else ["system:authenticated"]
            app.tokens[tok] = {"user": user, "deny": deny, "groups": list(groups),
                               "rbac": bool(body.get("rbac"))}
            return self.reply(200, {"ok": True})
        if method == "POST" and p == "/tokens/revoke":
            app.tokens.pop(body.get("token"), None)
            return self.reply(200, {"ok": True})
        if method == "GET" and p == "/history":
            res = q.get("resource", "")
            plural, _, group = res.partition(".")
            with st.lock:
                out = []
                for (pl, g, ns, name), hist in st.obj_history.items():
                    if pl == plural and (not group or g == group) and \
                            ns == q.get("namespace", ns if pl in ("namespaces",) else "default") and \
                            name == q.get("name"):
                        out.extend(hist)
                out.sort(key=lambda h: int(h["rv"]))
            return self.reply(200, out)
        parts = [s for s in p.split("/") if s]
        if method == "POST" and len(parts) == 4 and parts[0] == "pods" and parts[3] == "ready":
            ready = bool(body.get("ready"))
            t = st.types[("", "v1", "pods")]
            try:
                with st.lock:
                    pod = st.get(t, parts[1], parts[2])
                    conds = [c for c in (pod.get("status") or {}).get("conditions") or []
                             if c.get("type") not in ("Ready", "ContainersReady")]
                    for ty in ("ContainersReady", "Ready"):
                        conds.append({"type": ty, "status": "True" if ready else "False",
                                      "lastProbeTime": None, "lastTransitionTime": now_rfc3339()})
                    pod.setdefault("status", {})["conditions"] = conds
                    new = st.update(t, parts[1], parts[2], pod, sub="status")
                return self.reply(200, st.out(t, new))
            except APIError as e:
                return self.reply(e.code, e.body())
        if len(parts) == 3 and parts[0] == "pods" and method == "GET":
            t = st.types[("", "v1", "pods")]
            try:
                return self.reply(200, st.out(t, st.get(t, parts[1], parts[2])))
            except APIError as e:
                return self.reply(e.code, e.body())
        if method == "POST" and len(parts) == 4 and parts[0] == "pods" and parts[3] == "evict":
            if app.kubelet is None:
                return self.reply(409, {"error": "no kubelet (start the stand-in with --kubelet)"})
            try:
                app.kubelet.evict(parts[1], parts[2], body.get("message"), body.get("grace", 0))
            except APIError as e:
                return self.reply(e.code, e.body())
            return self.reply(200, {"ok": True})
        if method == "GET" and p == "/nodes":
            nodes = app.cluster.describe()
            for n in nodes:
                if app.autoscaler is not None:
                    n["autoscaler"] = app.autoscaler.describe(n["name"])
            return self.reply(200, {"nodes": nodes})
        if method == "POST" and len(parts) == 3 and parts[0] == "nodes" and parts[2] == "reclaim":
            try:
                return self.reply(200, app.cluster.reclaim(parts[1], body.get("notice", 120)))
            except APIError as e:
                return self.reply(e.code, e.body())
        if p == "/node":
            if app.kubelet is None:
                return self.reply(409, {"error": "no kubelet (start the stand-in with --kubelet)"})
            if method == "POST" and "maxPods" in body:
                mp = body["maxPods"]
                app.kubelet.set_max_pods(None if mp is None else int(mp))
            return self.reply(200, app.kubelet.describe())
        if method == "POST" and p == "/tokens/serviceaccount":
            try:
                tok = app.mint_sa_token(body.get("namespace") or "default", body["name"],
                                        seconds=body.get("seconds"))
            except APIError as e:
                return self.reply(e.code, e.body())
            return self.reply(200, {"token": tok})
        if method == "GET" and p == "/state":
            return self.reply(200, {"rv": st.rv, "floor": st.floor, "outage": app.outage_mode,
                                    "port": app.port})
        return self.reply(404, {"error": "unknown admin path %s" % p})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--max-endpoints-per-slice", type=int, default=100)
    ap.add_argument("--history", type=int, default=1000)
    ap.add_argument("--bookmark-interval", type=float, default=1.0)
    ap.add_argument("--kubelet", action="store_true", help="run bound pods as local processes")
    ap.add_argument("--image", action="append", default=[], metavar="PATTERN=DIR[=ENTRYPOINT]",
                    help="images matching PATTERN (fnmatch) run with DIR first on PATH")
    ap.add_argument("--max-pods", type=int, default=None,
                    help="pods each node takes (default: 110, the kubelet's)")
    ap.add_argument("--nodes", type=int, default=1, help="nodes at start: standin-node, standin-node-1, ...")
    ap.add_argument("--zones", default="", metavar="Z1,Z2,...",
                    help="topology.kubernetes.io/zone of the nodes, round-robin (default: none)")
    ap.add_argument("--racks", default="", metavar="R1,R2,...",
                    help="the nodes' racks (--rack-label): node i takes R[(i // zones) %% racks]")
    ap.add_argument("--rack-label", default="nvidia.com/gpu.clique", metavar="KEY",
                    help="the node label --racks sets (default: NVIDIA's NVLink-domain label)")
    ap.add_argument("--pod-topology-labels", default="", metavar="KEY,...",
                    help="node labels the binding copies onto the pod beside topology.k8s.io/{zone,region} "
                         "(the PodTopologyLabels admission plugin's configured keys)")
    ap.add_argument("--autoscaler", type=int, default=0, metavar="MAX_NODES",
                    help="a cluster autoscaler between --nodes and MAX_NODES nodes (implies --kubelet)")
    ap.add_argument("--scale-up-delay", type=float, default=10.0,
                    help="seconds a pod stays Unschedulable before it triggers a scale-up")
    ap.add_argument("--scale-down-unneeded", type=float, default=600.0,
                    help="seconds a node stays unneeded before it is removed (real: 10 min)")
    ap.add_argument("--backoff", "--backoff-seconds", type=float, default=10.0,
                    help="first restart and image-pull back-off in seconds (real: 10)")
    ap.add_argument("--backoff-max", type=float, default=300.0, help="back-off cap (real: 300)")
    ap.add_argument("--gpus", type=int, default=0, help="each node's nvidia.com/gpu capacity")
    ap.add_argument("--node-label", action="append", default=[], metavar="K=V")
    ap.add_argument("--pod-cidr", default=None, help="127.R.0.0/16 for pod addresses (default: a free R)")
    ap.add_argument("--pass-env", action="append", default=[], metavar="NAME",
                    help="an environment variable (besides RL_*) containers get from the stand-in")
    args = ap.parse_args()
    d = os.path.abspath(args.dir)
    os.makedirs(d, exist_ok=True)
    args.dir = d

    make_certs(d, args.host)
    app = App(args)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(os.path.join(d, "server.crt"), os.path.join(d, "server.key"))
    ctx.set_alpn_protocols(["http/1.1"])
    app.sslctx = ctx
    token = secrets.token_urlsafe(32)
    app.tokens[token] = {"user": "standin-admin", "groups": [rbac.MASTERS, "system:authenticated"],
                         "deny": []}
    app.start_api(0)
    admin = ThreadingHTTPServer(("127.0.0.1", 0), AdminHandler)
    admin.daemon_threads = True
    admin.app = app
    threading.Thread(target=admin.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    eps = EndpointSliceController(app.store, args.max_endpoints_per_slice, log)
    threading.Thread(target=eps.run, daemon=True).start()
    threading.Thread(target=gc_loop, args=(app.store,), daemon=True).start()
    threading.Thread(target=NodeLifecycle(app.store, log).run, daemon=True, name="nodes").start()
    threading.Thread(target=DisruptionController(app.store, log).run, daemon=True, name="disruption").start()
    if app.kubelet is not None:
        threading.Thread(target=app.kubelet.run, daemon=True, name="kubelet").start()
    if app.autoscaler is not None:
        threading.Thread(target=app.autoscaler.run, daemon=True, name="autoscaler").start()

    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    write_file(os.path.join(d, "token"), token, 0o600)
    write_file(os.path.join(d, "kubeconfig"), kubeconfig(d, args.host, app.port, token), 0o600)
    write_file(os.path.join(d, "ready"), json.dumps({"port": app.port, "admin_port": admin.server_address[1],
                                                     "pid": os.getpid()}))
    log({"msg": "standin ready", "port": app.port, "admin_port": admin.server_address[1]})
    try:
        while not stop.wait(0.5):
            pass
    finally:
        log({"msg": "standin stopping"})
        if app.kubelet is not None:
            app.kubelet.shutdown()  # no container outlives the stand-in
    # Daemon threads (connections, watches, controllers) end with the process;
    # closing the listening sockets first makes clients see a refusal at once.
    try:
        if app.server:
            app.server.socket.close()
        admin.socket.close()
    except OSError:
        pass
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
