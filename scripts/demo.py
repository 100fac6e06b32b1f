"""The README's first command (`make demo`): index real photos with the default backbone (efficientnet-lite0-regis:
the offline EfficientNet-Lite0 plus regis's trained token head), start the
service, send an augmented copy of one photo to POST /v1/search over HTTP, print the ranked results.

Usage: python scripts/demo.py [--data demo-data] [--port 8765] [--photo skimage-chelsea.png]
Exit status 0 when the original photo comes back at rank 1.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np
from PIL import Image

from regis.data.augment import encode_jpeg, random_crop, rescale


def run(*args: str) -> None:
    print("$ regis", " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "regis", *args], check=True)


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as r:
                return json.load(r)
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.5)
    raise SystemExit(f"the server did not answer {url}/healthz within {timeout_s:.0f} s")


def post_image(url: str, data: bytes, filename: str, k: int) -> dict:
    boundary = uuid.uuid4().hex
    body = (
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n"
        f"Content-Type: image/jpeg\r\n\r\n"
    ).encode() + data + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(f"{url}/v1/search?k={k}", data=body, method="POST",
                                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("demo-data"))
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--photo", default="skimage-chelsea.png")
    ap.add_argument("-k", type=int, default=5)
    args = ap.parse_args()
    photos, index = args.data / "photos", args.data / "index"

    run("photos", str(photos))
    run("index", "build", str(photos), "--index", str(index), "--backbone", "efficientnet-lite0-regis")

    # the query: a crop (50-80 % of the area), downscaled to 40-80 %, re-encoded as JPEG quality 40
    original = Image.open(photos / args.photo).convert("RGB")
    rng = np.random.default_rng(0)
    query_img = rescale(random_crop(original, rng), rng)
    query = encode_jpeg(query_img, quality=40)
    (args.data / "query.jpg").write_bytes(query)
    print(f"query: {args.data / 'query.jpg'} = {args.photo} {original.size} cropped, resized to "
          f"{query_img.size}, JPEG q40, {len(query):,} bytes")

    url = f"http://127.0.0.1:{args.port}"
    print(f"$ regis serve --index {index} --port {args.port}", flush=True)
    server = subprocess.Popen([sys.executable, "-m", "regis", "serve", "--index", str(index), "--port",
                               str(args.port), "--log-level", "warning"])
    try:
        health = wait_healthy(url, server)
        print(f"service up: {health}")
        result = post_image(url, query, "query.jpg", args.k)
    finally:
        server.terminate()
        server.wait(timeout=30)

    print(f"\nPOST {url}/v1/search?k={args.k}  (index version {result['index_version']}, "
          f"{result['num_candidates']} candidates)")
    print(f"{'rank':>4}  {'score':>7}  {'id':>4}  path")
    for hit in result["results"]:
        print(f"{hit['rank']:>4}  {hit['score']:7.3f}  {hit['id']:>4}  {hit['path']}")
    t = result["timings_ms"]
    print("timings (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in t.items()))
    top = result["results"][0]["path"]
    if top == args.photo:
        print(f"\nOK: the original {args.photo} is at rank 1.")
        return 0
    print(f"\nFAILED: rank 1 is {top}, not {args.photo}.")
    return 1


if __name__ == "__main__":
    sys.exit(main())
