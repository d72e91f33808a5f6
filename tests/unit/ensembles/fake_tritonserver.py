"""A stand-in for tritonserver in the launcher's unit tests: answers /v2/health/ready on --http-port, starts two
"model processes" run through a link named triton_python_backend_stub (as Triton's Python backend does) with a
`<repo>/<model>/1/model.py` argument and a shared-memory region, and never reaps them (Triton 2.51 does not reap a stub that died on its own).
SIGINT: exits 0 (its stubs die with its process group, which the launcher kills)."""
import os
import signal
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:] if "=" in a)
stub = Path(os.environ["FAKE_STUB_LINK"])
repo = args["model-repository"]
for model in ("tensorrt_llm", "postprocessing"):
    script = Path(repo) / model / "1" / "model.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("import time\ntime.sleep(600)\n")
    region = f"triton_python_backend_shm_region_fake-{uuid.uuid4()}"  # as the backend names its regions
    Path("/dev/shm", region).write_bytes(b"")
    if os.fork() == 0:
        os.execv(stub, [str(stub), str(script), region])


class Ready(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/v2/health/ready" else 404)
        self.end_headers()

    def log_message(self, *a):
        pass


server = ThreadingHTTPServer(("127.0.0.1", int(args["http-port"])), Ready)
threading.Thread(target=server.serve_forever, daemon=True).start()
signal.signal(signal.SIGINT, lambda *a: os._exit(0))
signal.pause()
