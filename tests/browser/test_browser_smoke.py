"""The browser fixture itself: headless Chromium renders a page served on loopback."""

from __future__ import annotations

import http.server
import threading


def test_chromium_renders_a_loopback_page(browser, tmp_path):
    (tmp_path / "index.html").write_text("<html><body><h1 id='t'>regis</h1></body></html>")
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html")
        assert page.text_content("#t") == "regis"
        page.close()
    finally:
        server.shutdown()
